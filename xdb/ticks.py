"""Each session's next tick, reserved in memory so recording a token costs no database round trip.

A session not held here is looked up once (`lookup`: the last tick the file holds for it, -1 for
none) and continues from there, across restarts and compression. At most `max_sessions` are held, the
least recently used dropped first, but only once all their reserved ticks are committed: otherwise a
lookup would read an older last tick back and hand out the same ticks twice.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable


class TickBook:
    def __init__(self, lookup: Callable[[str], int], max_sessions: int) -> None:
        self._lookup = lookup
        self.max_sessions = max_sessions
        self._last: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def next_ticks(self, session_id: str, n: int = 1) -> range:
        """Reserve n consecutive ticks for a session."""
        if n < 1:
            raise ValueError("n must be at least 1")
        with self._lock:
            last = self._last.get(session_id)
            if last is None:
                last = self._lookup(session_id)
            first = last + 1
            self._last[session_id] = first + n - 1
            self._last.move_to_end(session_id)
            if len(self._last) > self.max_sessions:
                self._trim()
        return range(first, first + n)

    def start_session(self, session_id: str) -> None:
        """A session id just made (a fresh random one), so no rows anywhere: its ticks start at 0
        without a lookup. No effect on a known session."""
        with self._lock:
            self._last.setdefault(session_id, -1)

    def forget(self, session_id: str) -> None:
        """Drop the session's next tick, so the next reservation looks it up again: another process
        recorded in the session since (call it once every tick reserved here is committed)."""
        with self._lock:
            self._last.pop(session_id, None)

    def knows(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._last

    def load(self, session_id: str) -> None:
        """Look a session's last tick up now, so its next reservation makes no lookup: call it from a
        thread where the lookup (a database read) may wait. No effect on a known session."""
        if self.knows(session_id):
            return
        last = self._lookup(session_id)
        with self._lock:
            self._last.setdefault(session_id, last)  # a reservation made meanwhile knew better
            if len(self._last) > self.max_sessions:
                self._trim()

    def __len__(self) -> int:
        return len(self._last)

    def _trim(self) -> None:
        """Drop the least recently used sessions whose rows are all committed; one with rows still
        queued moves to the recent end and is tried again later. A few lookups per call at most."""
        for _ in range(min(8, len(self._last) - self.max_sessions)):
            session_id, reserved = next(iter(self._last.items()))
            if self._lookup(session_id) >= reserved:
                del self._last[session_id]
            else:
                self._last.move_to_end(session_id)
