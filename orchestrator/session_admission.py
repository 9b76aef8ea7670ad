"""Session-aware admission: many agents on one KV cache without each evicting the others' prefixes.

vLLM keeps a finished request's blocks as prefix cache until it needs them, then reuses the least
recently used. When the sessions' contexts together exceed the cache, first-come-first-served lets a
cold session's prefill evict the prefix of an agent that is only thinking between two turns, so every
turn re-prefills its whole context and the cache's value collapses exactly when it matters.

This keeps a model of what the cache holds per session (each session's last prompt and reply, in
blocks, least recently used first) and, before a session's turn goes to the engine:

- a session whose prefix is resident goes at once (its turn is mostly a cache read);
- a cold session goes at once if the cache has room for it without evicting a *hot* session (one with
  a turn running, or one that finished a turn within `hot_s`: an agent about to come back);
- otherwise it waits, in arrival order, until the sessions it would evict have gone quiet, and never
  longer than `max_wait_s`: then it goes anyway (no one starves), evicting the least recently used.

So a working set that fits is served from the cache, and the rest take turns at it instead of thrashing.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Resident:
    blocks: int  # what the session's last turn left in the cache
    last_used: float  # when its last turn ended (or started, while one runs)
    running: int = 0


@dataclass(frozen=True)
class Admitted:
    """How a session's turn was let in, for the report and the metrics."""

    waited_s: float  # 0 unless it was held back
    hot: bool  # its prefix was resident
    timed_out: bool  # it went after max_wait_s, evicting hot sessions


class SessionAdmission:
    def __init__(self, capacity_blocks: Callable[[], int], hot_s: float, max_wait_s: float,
                 poll_s: float = 0.02, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity_blocks = capacity_blocks  # 0 until the engine reports its cache: nothing to govern
        self.hot_s = hot_s
        self.max_wait_s = max_wait_s
        self.poll_s = poll_s
        self.clock = clock
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # least recently used first
        self._waiting: deque[str] = deque()

    def is_resident(self, session_id: str) -> bool:
        return session_id in self._resident

    def blocked_by(self, session_id: str, blocks: int) -> list[str]:
        """The hot sessions this session's turn of `blocks` would evict, if it went now."""
        capacity = self.capacity_blocks()
        if capacity <= 0:
            return []
        others = [(sid, r) for sid, r in self._resident.items() if sid != session_id]
        held = sum(r.blocks for _, r in others)
        now = self.clock()
        hot: list[str] = []
        for sid, resident in others:  # least recently used first: vLLM's eviction order
            if held + blocks <= capacity:
                break
            held -= resident.blocks
            if resident.running or now - resident.last_used < self.hot_s:
                hot.append(sid)
        return hot

    async def admit(self, session_id: str, blocks: int) -> Admitted:
        """Wait until the session's turn may go (at most max_wait_s); it is then counted as running."""
        start = self.clock()
        hot = self.is_resident(session_id)
        timed_out = waited = False
        if not hot and self._must_wait(session_id, blocks):
            waited = True
            self._waiting.append(session_id)
            try:
                while self._must_wait(session_id, blocks):
                    if self.clock() - start >= self.max_wait_s:
                        timed_out = True
                        break
                    await asyncio.sleep(self.poll_s)
            finally:
                self._waiting.remove(session_id)
        self._enter(session_id, blocks)
        return Admitted(self.clock() - start if waited else 0.0, hot, timed_out)

    def _must_wait(self, session_id: str, blocks: int) -> bool:
        # Arrival order among the cold: one that came earlier and still waits goes first.
        ahead = self._waiting and self._waiting[0] != session_id
        return bool(ahead or self.blocked_by(session_id, blocks))

    def _enter(self, session_id: str, blocks: int) -> None:
        resident = self._resident.pop(session_id, None) or _Resident(blocks, self.clock())
        resident.blocks = max(resident.blocks, blocks)
        resident.running += 1
        resident.last_used = self.clock()
        self._resident[session_id] = resident
        self._evict_past_capacity()

    def finished(self, session_id: str, blocks: int | None = None) -> None:
        """The session's turn is over; `blocks`: what it leaves in the cache (prompt and reply), if known."""
        resident = self._resident.get(session_id)
        if resident is None:
            return
        resident.running = max(resident.running - 1, 0)
        resident.last_used = self.clock()
        if blocks is not None:
            resident.blocks = blocks
        self._resident.move_to_end(session_id)
        self._evict_past_capacity()

    def _evict_past_capacity(self) -> None:
        """Drop from the model what vLLM will have reused: least recently used first, past the capacity."""
        capacity = self.capacity_blocks()
        if capacity <= 0:
            return
        held = sum(r.blocks for r in self._resident.values())
        for sid in list(self._resident):
            if held <= capacity:
                break
            resident = self._resident[sid]
            if resident.running:
                continue
            held -= resident.blocks
            del self._resident[sid]
