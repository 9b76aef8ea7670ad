"""Session-aware admission: many agents on one KV cache without each evicting the others' prefixes,
and without paying more in waiting than the cache saves.

vLLM keeps a finished request's blocks as prefix cache until it needs them, then reuses the least
recently used. When the sessions' contexts together exceed the cache, first-come-first-served lets a
cold session's prefill evict the prefix of an agent that is only thinking between two turns; least
recently used is then the agent about to come back, so every turn re-prefills its whole context.

This keeps a model of what the cache holds per session (each session's last prompt and reply, in
blocks, least recently used first) and of each session's rhythm (the gap it leaves between turns),
and before a session's turn goes to the engine:

- a session whose prefix is resident goes at once (its turn is mostly a cache read);
- a cold session goes at once if what it would evict is not worth keeping: sessions that are quiet
  (past their own think time, capped by `hot_s`), prefixes an offload tier keeps (restored by a copy,
  not recomputed), or nothing at all;
- otherwise it may wait for the hot sessions it would evict to come back, but only while the wait it
  has paid plus the time until they return stays under the prefill their eviction would cost them
  (`wait_per_prefill` seconds of wait per second of prefill), and never past `max_wait_s`.

Waiting is weighed in the one currency both sides pay: seconds. When re-prefilling is cheap (a small
model, short contexts, an idle engine) no turn is held and this is first come, first served; when it is
dear (long contexts on a busy engine) a cold turn waits the few hundred milliseconds until the agent
it would evict is back and has refreshed its blocks. Each waiter decides alone, so a small turn that
fits goes past a large one that does not (no head-of-line blocking); the wait bound keeps both moving.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# A session is hot until its usual gap between turns, with this margin, has passed: think times vary.
HOT_MARGIN = 1.5
# Weight of the newest gap in a session's running estimate: rhythms drift, one odd gap should not.
GAP_WEIGHT = 0.5
# Sessions whose rhythm is remembered; past this the least recently seen are forgotten.
MAX_RHYTHMS = 4096
# Gaps of other sessions a new session's rhythm is guessed from (their median).
RECENT_GAPS = 64


@dataclass
class _Resident:
    blocks: int  # what the session's last turn left in the cache
    last_used: float  # when its last turn ended (or started, while one runs)
    running: int = 0


@dataclass
class _Rhythm:
    ended: float | None = None  # when its last turn ended
    gap_s: float | None = None  # its usual time between a reply and its next turn


@dataclass(frozen=True)
class Admitted:
    """How a session's turn was let in, for the report and the metrics."""

    waited_s: float  # 0 unless it was held back
    hot: bool  # its prefix was resident
    timed_out: bool  # it went after max_wait_s, evicting hot sessions


@dataclass(frozen=True)
class Costs:
    """What the engine reports that the decision needs, each read when a turn asks to go."""

    capacity_blocks: Callable[[], int]  # the GPU cache; 0 until the engine reports it: nothing to govern
    prefill_s_per_block: Callable[[], float | None]  # None until a prefill was measured: nothing is held
    offload_blocks: Callable[[], int] = lambda: 0  # the CPU tier's capacity (0: no offloading)


def offload_blocks(gib: float | None, bytes_per_block: int) -> int:
    """The GPU blocks an offload buffer of `gib` GiB holds (0 when off, or before the engine reports the
    bytes a block takes)."""
    if not gib or bytes_per_block <= 0:
        return 0
    return int(gib * (1 << 30)) // bytes_per_block


class SessionAdmission:
    def __init__(self, costs: Costs, hot_s: float, max_wait_s: float, wait_per_prefill: float = 1.0,
                 poll_s: float = 0.02, clock: Callable[[], float] = time.monotonic) -> None:
        self.costs = costs
        self.hot_s = hot_s
        self.max_wait_s = max_wait_s
        self.wait_per_prefill = wait_per_prefill
        self.poll_s = poll_s
        self.clock = clock
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # least recently used first
        self._offloaded: OrderedDict[str, int] = OrderedDict()  # the CPU tier, least recently used first
        self._rhythms: OrderedDict[str, _Rhythm] = OrderedDict()
        self._gaps: list[float] = []

    def is_resident(self, session_id: str) -> bool:
        return session_id in self._resident

    def is_offloaded(self, session_id: str) -> bool:
        return session_id in self._offloaded

    # ----- the rhythm: when a thinking agent is expected back -----

    def gap_s(self, session_id: str) -> float:
        """The session's usual think time: its own, else other sessions' median, else hot_s; at most hot_s."""
        rhythm = self._rhythms.get(session_id)
        if rhythm is not None and rhythm.gap_s is not None:
            return min(rhythm.gap_s, self.hot_s)
        return min(statistics.median(self._gaps), self.hot_s) if self._gaps else self.hot_s

    def is_hot(self, session_id: str, now: float) -> bool:
        """A turn running, or one ended within its own think time (with a margin, at most hot_s)."""
        resident = self._resident.get(session_id)
        if resident is None:
            return False
        if resident.running:
            return True
        return now - resident.last_used < min(self.gap_s(session_id) * HOT_MARGIN, self.hot_s)

    def back_in_s(self, session_id: str, now: float) -> float:
        """How long until a thinking session's next turn is expected (0: due now)."""
        resident = self._resident[session_id]
        return max(resident.last_used + self.gap_s(session_id) - now, 0.0)

    def _observe_start(self, session_id: str, now: float) -> None:
        rhythm = self._rhythms.pop(session_id, None) or _Rhythm()
        if rhythm.ended is not None:
            gap = now - rhythm.ended
            rhythm.gap_s = gap if rhythm.gap_s is None else GAP_WEIGHT * gap + (1 - GAP_WEIGHT) * rhythm.gap_s
            self._gaps = [*self._gaps[-(RECENT_GAPS - 1):], gap]
        self._rhythms[session_id] = rhythm
        while len(self._rhythms) > MAX_RHYTHMS:
            self._rhythms.popitem(last=False)

    # ----- the decision -----

    def evicted_by(self, session_id: str, blocks: int) -> list[str]:
        """The sessions this session's turn of `blocks` would evict if it went now, least recently used
        first (vLLM's order); running turns' blocks are in use and never evicted."""
        capacity = self.costs.capacity_blocks()
        if capacity <= 0:
            return []
        others = [(sid, r) for sid, r in self._resident.items() if sid != session_id]
        held = sum(r.blocks for _, r in others) + blocks
        evicted: list[str] = []
        for sid, resident in others:
            if held <= capacity:
                break
            if resident.running:
                continue
            held -= resident.blocks
            evicted.append(sid)
        return evicted

    def protected_by(self, session_id: str, blocks: int) -> list[str]:
        """The evictions worth avoiding: hot sessions whose prefix no offload tier keeps."""
        now = self.clock()
        return [sid for sid in self.evicted_by(session_id, blocks)
                if self.is_hot(sid, now) and sid not in self._offloaded]

    def hold_s(self, session_id: str, blocks: int, waited_s: float) -> float:
        """How much longer the turn may still wait for the hot sessions it would evict; 0: let it go.
        Worth it while the wait paid and still to come is under the prefill those sessions would redo."""
        protected = self.protected_by(session_id, blocks)
        per_block = self.costs.prefill_s_per_block()
        if not protected or per_block is None or waited_s >= self.max_wait_s:
            return 0.0
        now = self.clock()
        saved = sum(self._resident[sid].blocks for sid in protected) * per_block * self.wait_per_prefill
        until_back = max(self.back_in_s(sid, now) for sid in protected)
        if waited_s + until_back > saved:
            return 0.0
        return min(saved, self.max_wait_s) - waited_s

    async def admit(self, session_id: str, blocks: int) -> Admitted:
        """Wait while holding the turn back pays (at most max_wait_s); it is then counted as running."""
        start = self.clock()
        self._observe_start(session_id, start)  # its think time ends when it asks, not when it is let in
        hot = self.is_resident(session_id)
        waited = timed_out = False
        while not hot and self.hold_s(session_id, blocks, self.clock() - start) > 0:
            waited = True
            await asyncio.sleep(self.poll_s)
        if waited:
            timed_out = self.clock() - start >= self.max_wait_s
        self._enter(session_id, blocks)
        return Admitted(self.clock() - start if waited else 0.0, hot, timed_out)

    # ----- the model of the cache -----

    def _enter(self, session_id: str, blocks: int) -> None:
        now = self.clock()
        resident = self._resident.pop(session_id, None) or _Resident(blocks, now)
        resident.blocks = max(resident.blocks, blocks)
        resident.running += 1
        resident.last_used = now
        self._resident[session_id] = resident
        self._evict_past_capacity()

    def finished(self, session_id: str, blocks: int | None = None) -> None:
        """The session's turn is over; `blocks`: what it leaves in the cache (prompt and reply), if known."""
        resident = self._resident.get(session_id)
        if resident is None:
            return
        now = self.clock()
        resident.running = max(resident.running - 1, 0)
        resident.last_used = now
        if blocks is not None:
            resident.blocks = blocks
        self._resident.move_to_end(session_id)
        rhythm = self._rhythms.get(session_id)
        if rhythm is not None:
            rhythm.ended = now
        self._store_offloaded(session_id, resident.blocks)
        self._evict_past_capacity()

    def _store_offloaded(self, session_id: str, blocks: int) -> None:
        """vLLM's offloading connector copies each finished request's blocks to the CPU tier, which
        drops its least recently used past its capacity: the same model, one tier down."""
        capacity = self.costs.offload_blocks()
        if capacity <= 0:
            self._offloaded.clear()
            return
        self._offloaded.pop(session_id, None)
        if blocks > capacity:
            return
        self._offloaded[session_id] = blocks
        held = sum(self._offloaded.values())
        while held > capacity:
            _, dropped = self._offloaded.popitem(last=False)
            held -= dropped

    def _evict_past_capacity(self) -> None:
        """Drop from the model what vLLM will have reused: least recently used first, past the capacity."""
        capacity = self.costs.capacity_blocks()
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
