"""The agent's three context tiers as the orchestrator's blocks, sent in the chat request's `context`
field.

Tier 1, the permanent core (persona, grammar of symbols and instruments, the law language, how to
work) is Identity: byte-identical every turn, so it is always a prefix-cache hit. The tool schemas
travel in the request's `tools`, which the chat template renders ahead of it, equally fixed. Tier 2,
the evolving theory (the negative-knowledge summary, what earlier runs on the same rule refuted, laws
awaiting promotion, stored theorems) is
Karma: a newly stored theorem is appended, so the server stages it in the State and the cache holds;
an edited or retracted one rewrites the block, and the cache report then names `karma`. Tier 3, the
rolling journal, is the server session's State: append-only, so each turn extends the cached prefix; a
compaction moves it into Karma and starts a fresh session.
"""

from __future__ import annotations

import json
from typing import Any

from agent.journal import clip
from agent.knowledge import Knowledge
from universe.laws.json_schema import OP_HELP

PERSONA = (
    "You are a Popperian scientist. A hidden universe runs by a law you must reverse-engineer. You know "
    "nothing yet: every belief is a conjecture until it survives attempts to refute it. Each turn, write "
    "a short LAB NOTE (what you believe, what would refute it, what you test now), then call one tool.")

GRAMMAR = (
    "The universe: a ring of L cells, each one of the symbols _ A B K (codes 0 1 2 3); cell i's left "
    "neighbour is cell (i-1) mod L. Each step every cell's next symbol depends only on its window "
    "(left, centre, right) and its coordinate class i mod P, for an unknown period P. The whole law is a "
    "table: table[c][16*left + 4*centre + right] is the next symbol of a cell of class c.")

INSTRUMENTS = (
    "Instruments inside laws: neighbor_config (the window 16*left+4*centre+right), coordinate_class "
    "{period} (i mod period), transition_indicator (how many cells changed). " + OP_HELP)

LAW_EXAMPLES = (
    'Law forms: {"law": "local_transition", "context": "A.B", "becomes": "K", "period": 1, "class": 0}; '
    '{"law": "invariant", "expr": {"op": "count", "symbol": "K"}}; '
    '{"law": "symmetry", "reflect": true, "permute": {"A": "B", "B": "A"}}; '
    '{"law": "implication", "if": {"op": "matches", "pattern": "A_B"}, "then": {"op": "eq", "args": '
    '[{"op": "next", "expr": {"op": "cell"}}, {"op": "symbol", "value": "K"}]}}; holds, monotone.')

METHOD = (
    "Tools: run_prediction (predict a state's next state: PASS, or FAIL with the truth), request_samples, "
    "evaluate_laws (laws get ids L1, L2, ...: PASS or FAIL with a counterexample), store_theorem (lock in "
    "laws that passed repeatedly), retrieve_theorems, edit_theorem (restrict or retract one), query_log "
    "(search your own past turns by a pattern such as 'AA_B' or words: recall, do not memorise), "
    "submit_theory (the complete table, one 64-symbol string per class; checked on 5,000 random states; "
    "the experiment ends when it is exact). Design experiments that test many windows and classes at once.")

SHORT_IDENTITY = (
    "You are a Popperian scientist and know nothing yet. The universe is a ring of cells over _ A B K; each "
    "step a cell's next symbol depends on its (left, centre, right) symbols and its class i mod P, P unknown. "
    "Each turn write a short LAB NOTE, then call one tool. submit_theory with the full table (one 64-symbol "
    "string per class, index 16*left+4*centre+right) ends the run; query_log recalls past turns.")


def identity_text(prompt_size: str = "full") -> str:
    """Tier 1: the full text, or a short one for small windows (compact, minimal)."""
    if prompt_size != "full":
        return SHORT_IDENTITY
    return "\n\n".join([PERSONA, GRAMMAR, INSTRUMENTS, LAW_EXAMPLES, METHOD])


def karma_entries(knowledge: Knowledge, max_chars: int = 600) -> list[dict[str, Any]]:
    """Tier 2 as Karma entries: the summaries (fixed between compactions), then the theorems verbatim
    (never pruned) in the order they were stored, so a new theorem is appended: the server stages it
    in the State instead of rewriting the Karma block (orchestrator/karma.py)."""
    entries = []
    if knowledge.negative_knowledge:
        entries.append({"id": "negative-knowledge", "verbatim": False,
                        "text": "Falsified so far: " + clip(knowledge.negative_knowledge, max_chars)})
    if knowledge.prior_note:  # read once as the run starts: fixed for the whole run, so the cache holds
        entries.append({"id": "prior-runs", "verbatim": False,
                        "text": "Refuted in earlier runs on this rule: " + clip(knowledge.prior_note, max_chars)})
    if knowledge.candidates_note:  # a snapshot taken at the last compaction, so Karma stays put between
        entries.append({"id": "candidate-laws", "verbatim": False,
                        "text": "Passed repeatedly, not yet theorems: " + clip(knowledge.candidates_note, max_chars)})
    for t in knowledge.theorems:
        if t.status == "retracted":
            continue
        laws = clip(json.dumps(t.laws, sort_keys=True), max_chars)
        entries.append({"id": f"theorem-{t.theorem_id}", "verbatim": True,
                        "text": f"Theorem {t.theorem_id} '{t.name}' ({t.status}, laws {', '.join(t.law_ids)}): "
                                f"{clip(t.description, max_chars)} {laws}"})
    return entries


KARMA_CHARS = {"full": 1500, "compact": 600, "minimal": 200}  # one Karma entry's share of the prompt


def context_field(session_id: str, identity: str, knowledge: Knowledge, prompt_size: str = "full",
                  mode: str = "auto") -> dict[str, Any]:
    """The request's `context`: Identity and Karma from tiers 1 and 2; the server holds tier 3."""
    return {"session_id": session_id, "identity": identity, "mode": mode,
            "karma": karma_entries(knowledge, KARMA_CHARS[prompt_size])}
