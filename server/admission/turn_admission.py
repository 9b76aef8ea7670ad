"""VRAM admission of a chat turn: the KV blocks it will add must be free before the engine sees it.

Short of blocks the governor waits, then asks the turn to compact its State, then refuses (429); the
blocks stay reserved until the turn closes, so concurrent requests do not count the same room twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from opentelemetry import trace
from prometheus_client import Histogram

from core.errors import Unavailable
from core.spans import GOVERNOR_ACTIONS, SESSION_ID
from orchestrator.turn import Turn
from server.admission.session_admission import SessionAdmission
from server.admission.vram_governor import VramGovernor
from server.recording.recorder import Recorder

POLL_S = 0.05

tracer = trace.get_tracer(__name__)


async def admit(turn: Turn, governor: VramGovernor, asked: Asked, max_model_len: int,
                sessions: SessionAdmission | None = None, waits: Histogram | None = None,
                priority: int | None = None) -> None:
    """Let the session's turn in (session-aware, when on), then reserve its blocks (`asked`: what the
    turn's request asks to generate; `priority`: the engine's priority for it, by which the governor lets
    waiting turns in) or raise GovernorRejected; what the governors did goes in the report."""

    async def shrink() -> int | None:
        return _blocks_needed(turn, governor, asked, max_model_len) if await turn.shrink() else None

    actions: list[str] = []
    blocks = _blocks_needed(turn, governor, asked, max_model_len)
    with tracer.start_as_current_span("ahc.governor.admit") as span:
        try:
            if sessions is not None and turn.prepared.session is not None:
                await _admit_session(turn, sessions, governor, asked, actions, waits)
            reservation = await governor.admit(blocks, shrink if turn.prepared.session is not None else None,
                                               actions, priority)
        finally:
            for action in actions:
                turn.report.note(action)
            if span.is_recording():
                span.set_attributes({SESSION_ID: turn.session_id, "ahc.governor.kv_blocks": blocks,
                                     GOVERNOR_ACTIONS: actions})
    turn.on_close(reservation.release)


async def _admit_session(turn: Turn, sessions: SessionAdmission, governor: VramGovernor, asked: Asked,
                         actions: list[str], waits: Histogram | None) -> None:
    # What the turn leaves in the cache: its whole prompt and the reply it asks room for.
    footprint = governor.blocks_needed(turn.prepared.prompt.tokens, 0, asked.completion_tokens or 0)
    session_id = turn.session_id
    admitted = await sessions.admit(session_id, footprint)
    turn.on_close(lambda: sessions.finished(session_id))
    if admitted.waited_s > 0:
        if waits is not None:
            waits.observe(admitted.waited_s)
        actions.append("session_wait_timeout" if admitted.timed_out else "session_wait")


async def wait_for_recording(recorder: Recorder, timeout_s: float, retry_after_s: int) -> None:
    """Back-pressure from the experience database: while its backlog is over the bound a new request
    waits, then is refused (503); requests already running are not held up. A stopped writer refuses
    at once, since nothing more could be recorded."""
    if not recorder.alive:
        raise Unavailable("the experience database has stopped recording; see the server log", retry_after_s)
    if not recorder.queue.over_backlog:
        return
    refusal = paused_refusal(recorder, retry_after_s)
    with tracer.start_as_current_span("ahc.governor.recording_backlog",
                                      attributes={"ahc.xdb.backlog_rows": recorder.queue.backlog_rows}):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while recorder.queue.over_backlog:
            if loop.time() >= deadline:
                raise refusal or Unavailable(f"the experience database is behind by {recorder.queue.backlog_rows} "
                                             "rows; retry later", retry_after_s)
            await asyncio.sleep(POLL_S)


def paused_refusal(recorder: Recorder, retry_after_s: int) -> Unavailable | None:
    """While the disk has paused recording, the 503 that names the disk and what to do (None: not paused)."""
    state, why = recorder.recording_state()
    if state != "paused":
        return None
    refusal = Unavailable(f"recording is paused because the experience database's disk failed: {why}. New "
                          "requests are refused until it has room again; retry later", retry_after_s)
    refusal.code = "xdb_disk_full"
    return refusal


@dataclass(frozen=True)
class Asked:
    """What a request asks the engine to generate, read once from its validated (typed) request:
    each completion's token budget (None: the request names none) and how many completions (`n`)."""

    completion_tokens: int | None = None
    choices: int = 1

    @classmethod
    def of(cls, completion_tokens: int | None, n: int | None) -> Asked:
        """From the request's typed fields (chat: max_completion_tokens, else max_tokens); a budget or a
        count under 1 is read as none named."""
        return cls(completion_tokens if completion_tokens is not None and completion_tokens > 0 else None,
                   n if n is not None and n > 1 else 1)

    def new_tokens(self, max_model_len: int, prompt_tokens: int) -> int:
        """Each completion's budget; without one, what the window leaves."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return max(max_model_len - prompt_tokens, 0)


def request_blocks(governor: VramGovernor, asked: Asked, max_model_len: int, prompt_tokens: int,
                   cached_tokens: int) -> int:
    """The KV blocks a request adds: its uncached prompt once, and a completion budget per choice."""
    return governor.blocks_needed(prompt_tokens, cached_tokens, asked.new_tokens(max_model_len, prompt_tokens),
                                  asked.choices)


def _blocks_needed(turn: Turn, governor: VramGovernor, asked: Asked, max_model_len: int) -> int:
    return request_blocks(governor, asked, max_model_len, turn.prepared.prompt.tokens,
                          turn.report.cached_estimate())
