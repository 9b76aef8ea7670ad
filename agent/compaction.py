"""The compaction event: when tier 3 passes its token threshold, its raw turns are condensed into
tier 2 and leave the prompt.

1. Summarise: the policy's hidden call updates the negative knowledge from the journal's transcript;
   the laws that passed repeatedly but are no theorem yet are listed from the law registry.
2. Snapshot: theorems, summary and `last_compacted_turn` go to meta_knowledge.
3. Reset: the condensed turns leave the journal (the most recent one stays, for local
   troubleshooting); the loop starts a fresh server session replaying what is left, so the State
   that held the raw turns is gone from the prompt, and the summary sits in Karma.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.journal import Journal, clip
from agent.policies.base import Policy
from agent.tools import Toolbox

MAX_SUMMARY_CHARS = 1500


@dataclass(frozen=True)
class Compaction:
    turn: int  # the last turn condensed
    turns_condensed: int
    tokens_before: int
    version: int  # the meta_knowledge version written


def due(journal: Journal, threshold: int, last_prompt_tokens: int | None, window: int | None,
        reserve: int) -> bool:
    """Over the journal's threshold, or the last request (prompt and reply) plus the next reply's
    reserve is near the window: the journal's estimate can undercount a small tokenizer's tokens."""
    if len(journal.entries) < 2:  # the most recent turn always stays: nothing to condense
        return False
    if journal.tokens() > threshold:
        return True
    if window and last_prompt_tokens is not None:
        return last_prompt_tokens + reserve > 0.8 * window
    return False


def compact(journal: Journal, policy: Policy, toolbox: Toolbox, keep: int = 1) -> Compaction | None:
    """Condense all but the `keep` most recent turns (they stay for local troubleshooting); None if
    there is nothing older to condense."""
    old = journal.oldest(keep)
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
