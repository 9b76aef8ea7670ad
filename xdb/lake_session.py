"""Ticks that continue across replicas: a session another replica served resumes after its last tick.

In `ducklake` mode loading a session's State also reads the largest tick any replica shipped for it
(the lake's `session_ticks`), and the replica's tick book moves past it, so the rows recorded here next
never reuse a tick recorded elsewhere.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from xdb.ticks import TickBook


class ResumableTickBook(TickBook):
    """A TickBook that can be moved past a tick learnt elsewhere (no effect when already past it)."""

    def advance(self, session_id: str, last_tick: int) -> None:
        with self._lock:
            if session_id in self._last:
                self._last[session_id] = max(self._last[session_id], last_tick)


class LakeTicks:
    """The last tick the lake holds per session, as learnt when its State was loaded: at least as far as
    the local file's last tick goes for a session that then records nothing here. At most `max_sessions`
    held, the least recently loaded dropped first (a session loaded again learns it again)."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._last: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def learn(self, session_id: str, last_tick: int) -> None:
        if last_tick < 0:
            return
        with self._lock:
            self._last[session_id] = max(self._last.get(session_id, -1), last_tick)
            self._last.move_to_end(session_id)
            while len(self._last) > self.max_sessions:
                self._last.popitem(last=False)

    def get(self, session_id: str) -> int:
        with self._lock:
            return self._last.get(session_id, -1)
