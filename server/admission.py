"""VRAM admission of a chat turn: the KV blocks it will add must be free before the engine sees it.

Short of blocks the governor waits, then asks the turn to compact its State, then refuses (429); the
blocks stay reserved until the turn closes, so concurrent requests do not count the same room twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ahc.errors import Unavailable
from orchestrator.chat_turn import ChatTurn
from orchestrator.vram_governor import VramGovernor
from server.recorder import Recorder

POLL_S = 0.05


async def admit(turn: ChatTurn, governor: VramGovernor, body: dict[str, Any], max_model_len: int) -> None:
    """Reserve the turn's blocks or raise GovernorRejected; what the governor did goes in the report."""

    async def shrink() -> int | None:
        return _blocks_needed(turn, governor, body, max_model_len) if await turn.shrink() else None

    actions: list[str] = []
    try:
        reservation = await governor.admit(_blocks_needed(turn, governor, body, max_model_len),
                                           shrink if turn.prepared.session is not None else None, actions)
    finally:
        for action in actions:
            turn.report.note(action)
    turn.on_close(reservation.release)


async def wait_for_recording(recorder: Recorder, timeout_s: float, retry_after_s: int) -> None:
    """Back-pressure from the experience database: while its backlog is over the bound a new request
    waits, then is refused (503); requests already running are not held up. A stopped writer refuses
    at once, since nothing more could be recorded."""
    if not recorder.alive:
        raise Unavailable("the experience database has stopped recording; see the server log", retry_after_s)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while recorder.queue.over_backlog:
        if loop.time() >= deadline:
            raise Unavailable(f"the experience database is behind by {recorder.queue.backlog_rows} rows; "
                              "retry later", retry_after_s)
        await asyncio.sleep(POLL_S)


def requested_completion_tokens(body: dict[str, Any]) -> int | None:
    """The completion budget the request names (max_completion_tokens, else max_tokens), or None."""
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return asked
    return None


def max_new_tokens(body: dict[str, Any], max_model_len: int, prompt_tokens: int) -> int:
    """The completion budget the request asks for; without one, what the window leaves."""
    asked = requested_completion_tokens(body)
    return asked if asked is not None else max(max_model_len - prompt_tokens, 0)


def choices(body: dict[str, Any]) -> int:
    """How many completions (`n`) the request asks for; each one generates its own tokens."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def request_blocks(governor: VramGovernor, body: dict[str, Any], max_model_len: int, prompt_tokens: int,
                   cached_tokens: int) -> int:
    """The KV blocks a request adds: its uncached prompt once, and a completion budget per choice."""
    return governor.blocks_needed(prompt_tokens, cached_tokens, max_new_tokens(body, max_model_len, prompt_tokens),
                                  choices(body))


def _blocks_needed(turn: ChatTurn, governor: VramGovernor, body: dict[str, Any], max_model_len: int) -> int:
    return request_blocks(governor, body, max_model_len, turn.prepared.prompt.tokens, turn.report.cached_estimate())
