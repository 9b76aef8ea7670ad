"""The compaction event: when tier 3 passes its token threshold, its raw turns are condensed into
tier 2 and leave the prompt.

1. Summarise: the policy's hidden call updates the negative knowledge from the journal's transcript;
   the laws that passed repeatedly but are no theorem yet are listed from the law registry.
2. Snapshot: theorems, summary and `last_compacted_turn` go to meta_knowledge.
3. Reset: the condensed turns leave the journal; the most recent ones stay verbatim (their
   counterexamples are the evidence the next hypotheses are tested against): up to `keep` turns
   within `keep_tokens`, a share of the threshold, so one compaction leaves the journal well under the
   next, and the newest turn whatever its size (but when the prompt overflows the window). The loop
   starts a fresh server session replaying what is left, so the State that held the raw turns is gone
   from the prompt, and the summary sits in Karma.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.journal import Journal, clip
from agent.policies.base import Policy
from agent.tools import Toolbox

MAX_SUMMARY_CHARS = 1500
KEEP_TURNS = 12  # the newest turns kept verbatim through a compaction (the rolling context's 10 to 15)
KEEP_SHARE = 0.25  # ...within this share of the compaction threshold


@dataclass(frozen=True)
class Compaction:
    turn: int  # the last turn condensed
    turns_condensed: int
    tokens_before: int
    version: int  # the meta_knowledge version written


def kept(journal: Journal, keep: int, keep_tokens: int | None = None, at_least: int = 1) -> int:
    """How many of the newest turns stay verbatim: at most `keep`, together within `keep_tokens`
    (None: unbounded), but the newest `at_least` whatever their size (at most `keep`)."""
    count = used = 0
    for entry in reversed(journal.entries[-keep:] if keep else []):
        used += entry.tokens(journal.max_result_chars)
        if keep_tokens is not None and used > keep_tokens and count >= at_least:
            break
        count += 1
    return count


def due(journal: Journal, threshold: int, last_prompt_tokens: int | None, window: int | None,
        reserve: int, keep: int = 1, keep_tokens: int | None = None) -> bool:
    """Over the journal's threshold, or the last request (prompt and reply) plus the next reply's
    reserve is near the window (the journal's estimate can undercount a small tokenizer's tokens); and
    there are turns older than those kept (`keep` within `keep_tokens`, None: unbounded) to condense."""
    if len(journal.entries) <= kept(journal, keep, keep_tokens):
        return False
    if journal.tokens() > threshold:
        return True
    if window and last_prompt_tokens is not None:
        return last_prompt_tokens + reserve > 0.8 * window
    return False


def compact(journal: Journal, policy: Policy, toolbox: Toolbox, keep: int = 1,
            keep_tokens: int | None = None, at_least: int = 1) -> Compaction | None:
    """Condense all but the most recent turns (`kept`), which stay verbatim; None if there is nothing
    older to condense."""
    old = journal.oldest(kept(journal, keep, keep_tokens, at_least))
    if not old:
        return None
    knowledge = toolbox.knowledge
    tokens = journal.tokens()
    summary = policy.summarize(journal.transcript(old), knowledge).strip()
    knowledge.negative_knowledge = clip(summary, MAX_SUMMARY_CHARS) if summary else knowledge.negative_knowledge
    knowledge.candidates_note = knowledge.describe_candidates()
    knowledge.last_compacted_turn = old[-1].turn
    version = toolbox.snapshot()
    condensed = len(journal.drop_oldest(len(old)))
    return Compaction(old[-1].turn, condensed, tokens, version)
