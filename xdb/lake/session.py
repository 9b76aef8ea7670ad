"""Ticks that continue across replicas: a session another replica served resumes after its last tick; and
the tick book's calls, for the stores that keep one (`TickCalls`).

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


class TickCalls:
    """The tick book's calls, for a store that keeps one as `_ticks`: XDB, and XDB's interface over the
    service in each API process (xdb/service/remote_xdb.py), whose book is that process's own."""

    _ticks: ResumableTickBook

    def next_ticks(self, session_id: str, n: int = 1) -> range:
        """Reserve n consecutive ticks for a session, with no DB round trip; resumes after the largest
        tick stored for it (across restarts and compression)."""
        return self._ticks.next_ticks(session_id, n)

    def forget_ticks(self, session_id: str) -> None:
        """Another process recorded in the session since this one did: its next tick is looked up again."""
        self._ticks.forget(session_id)

    def ticks_known(self, session_id: str) -> bool:
        """Whether `next_ticks` would reserve for this session without looking its last tick up."""
        return self._ticks.knows(session_id)

    def load_ticks(self, session_id: str) -> None:
        """Look the session's last tick up now (from a thread, off the event loop)."""
        self._ticks.load(session_id)

    def start_session(self, session_id: str) -> None:
        """A session id just made (a fresh random one), so no rows anywhere: its ticks start at 0
        without the lookup `next_ticks` would make on the event loop. No effect on a known session."""
        self._ticks.start_session(session_id)
