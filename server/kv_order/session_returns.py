"""What the API process tells the engine about each request's session: its place in line (the priority
vLLM schedules it by) and its `ReturnHint` (when such sessions come back).

A session keeps the place its first call drew for all its calls, so with vLLM's priority scheduling a
session that has started finishes before new ones crowd it out (program-level first come, first served).
The gaps are measured here, from a call's reply to the session's next call, over every session.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from server.kv_order.return_hint import MAX_GAPS, ReturnHint

# Sessions whose place and last reply are remembered; past this the least recently seen are forgotten
# (one coming back draws a new place, as a new session would).
MAX_SESSIONS = 65_536
# The most a client's own priority defers its call: far past any place in line, far from int64's end.
MAX_DEFERRAL = 2 ** 40


class SessionReturns:
    def __init__(self, priority: bool, hints: bool, clock: Callable[[], float] = time.monotonic) -> None:
        """`priority`: calls carry their session's place in line; `hints`: their `ReturnHint`."""
        self.with_priority = priority
        self.with_hints = hints
        self.clock = clock
        self._places: OrderedDict[str, int] = OrderedDict()  # least recently seen first
        self._replied: dict[str, float] = {}  # when each session's last call ended
        self._gaps: deque[float] = deque(maxlen=MAX_GAPS)
        self._tickets = itertools.count()

    def engine_kwargs(self, session: str, request_id: str, asked_priority: int) -> dict[str, Any]:
        """What a call of `session` adds to the engine's `generate`: its priority and its hint."""
        hint = self.starting(session)
        extra: dict[str, Any] = {}
        if self.with_priority:
            extra["priority"] = self.priority(session, asked_priority)
        if self.with_hints:
            extra["kv_hints"] = hint.envelope(request_id)
        return extra

    def starting(self, session: str) -> ReturnHint:
        """A call of `session` goes to the engine: its gap is observed, and the hint it carries made."""
        replied = self._replied.pop(session, None)
        if replied is not None:
            self._gaps.append(self.clock() - replied)
        return ReturnHint(session, tuple(sorted(self._gaps)))

    def priority(self, session: str, asked: int = 0) -> int:
        """The engine priority of a call of `session` (lower goes first): its place in line, put later by
        `asked`, the client's own (vLLM's `priority`). A client may defer its calls, never move them ahead
        of sessions that began before its own: on a server shared by tenants a negative priority would
        otherwise let one of them starve the rest."""
        place = self._places.pop(session, None)
        if place is None:
            place = next(self._tickets)
        self._places[session] = place
        while len(self._places) > MAX_SESSIONS:
            forgotten, _ = self._places.popitem(last=False)
            self._replied.pop(forgotten, None)
        return place + min(max(asked, 0), MAX_DEFERRAL)

    def ended(self, session: str) -> None:
        """A call of `session` ended (its reply complete, or aborted)."""
        if session in self._places:
            self._replied[session] = self.clock()
