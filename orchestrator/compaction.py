"""Compaction: past a State token threshold, the oldest turns are condensed by the served model.

The summary joins the Karma block (after the karma entries), the condensed turns leave the State, and
the most recent `compaction_keep_turns` turns stay verbatim. Karma entries staged in State turns are
promoted to the Karma block first, so no entry is ever condensed. The caller stores the snapshot in XDB.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from ahc.config import OrchestratorConfig
from ahc.spans import SESSION_ID
from orchestrator.ctc_governor import turn_groups
from orchestrator.karma import promote
from orchestrator.session import Session
from orchestrator.token_counter import TokenCounter
from orchestrator.turn import Turn

tracer = trace.get_tracer(__name__)

SUMMARY_INSTRUCTION = (
    "Condense the conversation below into a short list of the facts, decisions and open questions it "
    "established. Keep numbers, names and results exactly. Reply with the list only.")


@dataclass(frozen=True)
class Compaction:
    """One compaction of a session's State, for the experience database's record of it."""

    turns: int  # messages condensed
    tokens_before: int  # State tokens before (the summary so far included)
    tokens_after: int  # State tokens after: the new summary and the turns kept
    summary: str


def state_tokens(turns: Sequence[Turn], counter: TokenCounter) -> int:
    return sum(counter.count(t.content) + sum(counter.count(a) for _, _, a in t.tool_calls) for t in turns)


def summary_request(session: Session, old: Sequence[Turn]) -> list[dict[str, Any]]:
    transcript = "\n".join(f"{t.role}: {t.content}" + "".join(f" [called {n}({a})]" for _, n, a in t.tool_calls)
                           for t in old)
    earlier = f"Summary so far: {session.summary}\n\n" if session.summary else ""
    return [{"role": "system", "content": SUMMARY_INSTRUCTION},
            {"role": "user", "content": f"{earlier}{transcript}"}]


async def compact(session: Session, incoming: Sequence[Turn], config: OrchestratorConfig, threshold_tokens: int,
                  counter: TokenCounter, summarize: Callable[[list[dict[str, Any]]], Awaitable[str]],
                  force: bool = False, keep: int | None = None) -> Compaction | None:
    """Condense the session's oldest turns when State is over `threshold_tokens` (or when forced: by the
    VRAM governor, or by a prompt over its budget); what it did, or None. `keep` overrides
    `compaction_keep_turns` (0 when even the kept turns do not fit)."""
    if not force and state_tokens([*session.turns, *incoming], counter) <= threshold_tokens:
        return None
    groups = turn_groups(tuple(session.turns))
    keep = config.compaction_keep_turns if keep is None else keep
    old_groups = groups[:-keep] if keep else groups
    if not old_groups:
        return None
    old = [t for group in old_groups for t in group]
    before = state_tokens(session.turns, counter) + counter.count(session.summary or "")
    with tracer.start_as_current_span("ahc.compaction", attributes={SESSION_ID: session.session_id,
                                                                   "ahc.compaction.turns": len(old)}):
        summary = (await summarize(summary_request(session, old))).strip()
    session.summary = summary or session.summary
    session.turns = session.turns[len(old):]
    promote(session)  # the condensed turns carried staged karma verbatim: it moves to the Karma block
    session.compactions += 1
    session.compacted_turns += len(old_groups)
    after = state_tokens(session.turns, counter) + counter.count(session.summary or "")
    return Compaction(len(old), before, after, session.summary or "")
