"""The sessions an engine-side policy knows of, and in which order their cached KV should go: ended or
overdue sessions first (the least recently finished first), then those with nothing to predict from, then
the idle ones expected back latest, and sessions with a call running last.

Both of vLLM's tiers rank by this: the CPU tier's eviction policy and the scheduler that orders the GPU's
free blocks. Each keeps its own, fed from the requests it sees (their `ReturnHint`s).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from server.kv_order.return_hint import ReturnHint, expected_back_s

# The sessions remembered; past this the least recently finished are forgotten (their KV ranks as unknown).
MAX_SESSIONS = 65_536
# A call running longer than this is taken as lost (its finish never seen): its session ranks as idle.
RUNNING_MAX_S = 900.0

Rank = tuple[int, float]  # smaller: evicted first
OVERDUE, UNKNOWN, EXPECTED, RUNNING = 0, 1, 2, 3


@dataclass
class _Session:
    gaps: tuple[float, ...] = ()
    finished_at: float | None = None
    running: dict[str, float] = field(default_factory=dict)  # request id -> when it started


class IdleSessions:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently finished first

    def started(self, hint: ReturnHint, request_id: str) -> None:
        state = self._state(hint)
        state.running.setdefault(request_id, self.clock())

    def finished(self, hint: ReturnHint, request_id: str) -> None:
        state = self._state(hint)
        state.running.pop(request_id, None)
        state.finished_at = self.clock()
        self._sessions.move_to_end(hint.session)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def _state(self, hint: ReturnHint) -> _Session:
        state = self._sessions.get(hint.session)
        if state is None:
            state = self._sessions[hint.session] = _Session()
        if hint.gaps:
            state.gaps = hint.gaps
        return state

    def rank(self, session: str, now: float) -> Rank:
        state = self._sessions.get(session)
        if state is None:
            return (UNKNOWN, float("-inf"))
        if any(now - started < RUNNING_MAX_S for started in state.running.values()):
            return (RUNNING, 0.0)
        finished = state.finished_at if state.finished_at is not None else float("-inf")
        if not state.gaps or state.finished_at is None:
            return (UNKNOWN, finished)
        back = expected_back_s(state.gaps, now - finished)
        if back is None:
            return (OVERDUE, finished)
        return (EXPECTED, -(now + back))  # the latest expected back goes first

    def ranks(self, sessions: Iterable[str]) -> dict[str, Rank]:
        """Each of `sessions`' rank, now."""
        now = self.clock()
        return {session: self.rank(session, now) for session in sessions}
