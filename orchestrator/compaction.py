"""Compaction: past a State token threshold, the oldest turns are condensed by the served model.

The summary joins the Karma block (after the karma entries), the condensed turns leave the State, and
the most recent `compaction_keep_turns` turns stay verbatim. Karma entries staged in State messages are
promoted to the Karma block first, so no entry is ever condensed. The caller stores the snapshot in XDB.

The summary call continues the session's own prompt: its blocks and State exactly as last sent, then
the instruction as a final user turn. That prompt is in the prefix cache (the session's last request
and its reply), so the engine prefills only the instruction. Where it cannot fit the window (a State
that grew past what the trigger allows), the old turns go as a transcript in a fresh prompt instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from core.config import OrchestratorConfig
from core.spans import SESSION_ID
from orchestrator.ctc_governor import turn_groups
from orchestrator.karma import promote
from orchestrator.message import Message
from orchestrator.session import Session
from orchestrator.token_counter import TokenCounter

tracer = trace.get_tracer(__name__)

SUMMARY_INSTRUCTION = (
    "Condense the conversation below into a short list of the facts, decisions and open questions it "
    "established. Keep numbers, names and results exactly. Reply with the list only.")
CONTINUED_INSTRUCTION = (
    "Condense our conversation so far (the summary of earlier turns included) into a short list of the "
    "facts, decisions and open questions it established. Keep numbers, names and results exactly. Reply "
    "with the list only.")


@dataclass(frozen=True)
class SummaryCall:
    """What the served model is asked to condense: chat messages, and the tools the chat template
    renders with them (the session's own, so a continued prompt matches the cached one)."""

    messages: list[dict[str, Any]]
    tools: tuple[dict[str, Any], ...] = ()
    continued: bool = False  # the session's prompt as last sent, then the instruction


@dataclass(frozen=True)
class SummaryReply:
    text: str
    prompt_tokens: int = 0
    cached_tokens: int = 0  # read from the prefix cache: the whole continued prompt but the instruction


# A summarizer may return the bare text (tests, a library user's own model call).
Summarize = Callable[[SummaryCall], Awaitable["SummaryReply | str"]]


@dataclass(frozen=True)
class Compaction:
    """One compaction of a session's State, for the experience database's record of it."""

    messages: int  # condensed
    tokens_before: int  # State tokens before (the summary so far included)
    tokens_after: int  # State tokens after: the new summary and the turns kept
    summary: str
    continued: bool = False  # the summary call continued the session's cached prompt
    prompt_tokens: int = 0  # of the summary call, as the engine counted them (0: not known)
    cached_tokens: int = 0


@dataclass(frozen=True)
class CompactionCall:
    """How to ask for this compaction's summary: `continuation`, the session's last prompt as it
    would be sent again now (None when it does not fit the window with the instruction and the
    summary's tokens); otherwise the transcript of the old turns."""

    continuation: list[dict[str, Any]] | None = None
    tools: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    # The most tokens the kept turns may hold, so that a compaction leaves room for more than a turn or
    # two (turns carrying long tool results or excerpts); None: no limit but the count of turns.
    keep_tokens: int | None = None


def state_tokens(messages: Sequence[Message], counter: TokenCounter) -> int:
    return sum(counter.count(m.content) + sum(counter.count(a) for _, _, a in m.tool_calls) for m in messages)


def kept_groups(groups: Sequence[tuple[Message, ...]], keep: int, keep_tokens: int | None,
                counter: TokenCounter) -> int:
    """How many of the newest turn groups stay verbatim: at most `keep`, and at most `keep_tokens`."""
    kept, tokens = 0, 0
    for group in reversed(groups):
        tokens += state_tokens(group, counter)
        if kept == keep or (keep_tokens is not None and tokens > keep_tokens):
            break
        kept += 1
    return kept


def summary_request(session: Session, old: Sequence[Message]) -> list[dict[str, Any]]:
    """A fresh prompt: the instruction and the old turns as a transcript."""
    transcript = "\n".join(f"{t.role}: {t.content}" + "".join(f" [called {n}({a})]" for _, n, a in t.tool_calls)
                           for t in old)
    earlier = f"Summary so far: {session.summary}\n\n" if session.summary else ""
    return [{"role": "system", "content": SUMMARY_INSTRUCTION},
            {"role": "user", "content": f"{earlier}{transcript}"}]


def continued_request(prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The session's prompt as last sent, then the instruction as the final user turn."""
    return [*prompt, {"role": "user", "content": CONTINUED_INSTRUCTION}]


def summary_call(session: Session, old: Sequence[Message], how: CompactionCall) -> SummaryCall:
    if how.continuation is not None:
        return SummaryCall(continued_request(how.continuation), how.tools, continued=True)
    return SummaryCall(summary_request(session, old))


async def compact(session: Session, incoming: Sequence[Message], config: OrchestratorConfig, threshold_tokens: int,
                  counter: TokenCounter, summarize: Summarize, force: bool = False, keep: int | None = None,
                  how: Callable[[], Awaitable[CompactionCall]] | None = None) -> Compaction | None:
    """Condense the session's oldest turns when State is over `threshold_tokens` (or when forced: by the
    VRAM governor, or by a prompt over its budget); what it did, or None. `keep` overrides
    `compaction_keep_turns` (0 when even the kept turns do not fit); `how` makes the call to send, and
    is asked only when the State is to be compacted (most requests are not)."""
    if not force and state_tokens([*session.messages, *incoming], counter) <= threshold_tokens:
        return None
    plan = await how() if how is not None else CompactionCall()
    groups = turn_groups(tuple(session.messages))
    keep = config.compaction_keep_turns if keep is None else keep
    old_groups = groups[:len(groups) - kept_groups(groups, keep, plan.keep_tokens, counter)]
    if not old_groups:
        return None
    old = [t for group in old_groups for t in group]
    before = state_tokens(session.messages, counter) + counter.count(session.summary or "")
    call = summary_call(session, old, plan)
    with tracer.start_as_current_span("ahc.compaction", attributes={SESSION_ID: session.session_id,
                                                                   "ahc.compaction.messages": len(old),
                                                                   "ahc.compaction.continued": call.continued}):
        answer = await summarize(call)
    reply = answer if isinstance(answer, SummaryReply) else SummaryReply(answer)
    summary = reply.text.strip()
    session.summary = summary or session.summary
    session.messages = session.messages[len(old):]
    session.last_turn = None  # what undid the last turn undoes it no more in a compacted State
    promote(session)  # the condensed turns carried staged karma verbatim: it moves to the Karma block
    session.compactions += 1
    session.compacted_turns += len(old_groups)
    after = state_tokens(session.messages, counter) + counter.count(session.summary or "")
    return Compaction(len(old), before, after, session.summary or "", call.continued, reply.prompt_tokens,
                      reply.cached_tokens)
