"""Session-aware admission: many agents on one KV cache without each evicting the others' prefixes,
and without paying more in waiting than the cache saves.

vLLM keeps a finished request's blocks as prefix cache until it needs them, then reuses the least
recently used. When the sessions' contexts together exceed the cache, first-come-first-served lets a
cold session's prefill evict the prefix of an agent that is only thinking between two turns; least
recently used is then the agent about to come back, so every turn re-prefills its whole context.

This keeps a model of what the cache holds per session (each session's last prompt and reply, in
blocks, least recently used first) and of each session's rhythm (the gap it leaves between turns).
A session is *in flight* while a turn of it runs or it is within its own think time (with a margin,
capped by `hot_s`); sessions in flight keep the place in line they took when they entered it. Before a
session's turn goes to the engine, one of two regimes decides:

- **The engine would drown in re-prefill** (the sessions in flight, re-prefilling their whole contexts
  once each, would take longer than a session's usual gap, `wait_per_prefill` seconds of wait per
  second of prefill): thrashing would then slow every session, so the cache is given to sessions in
  their order in line. A turn goes when it cuts no prefix of a session in flight ahead of it: its
  context fits beside theirs, and the blocks it takes, in vLLM's least-recently-used order, come
  from others (quiet sessions, those behind it). A turn that must prefill its context anew also
  leaves the sessions ahead room to grow for a few turns, so it is not squeezed out again soon. A
  turn that cannot go waits (a new session before it starts, a younger one between two calls once the
  older ones have grown) until older sessions finish or go quiet, never past `max_wait_s`. The first
  in line always goes. Each session in flight thus keeps its prefix through its tool and think time,
  as a time-to-live would, and the sessions in flight are capped to what the cache holds, the cap
  moving as they grow.
- **The engine has room to re-prefill** (a small model, short contexts, few sessions): a resident
  session goes at once; a cold one goes at once unless it would evict a session about to come back
  whose prefix no offload tier keeps, and then it waits only while the wait it has paid plus the time
  until that session returns stays under the prefill the eviction would cost it.

Waiting is weighed in the one currency both sides pay: seconds of the engine's measured prefill
(which, on a busy engine, includes the queue a prefill makes everyone wait in). Each waiter decides
alone, so a small turn that fits goes past a large one that does not (no head-of-line blocking).

With vLLM's CPU tier (native offloading), a prefix the GPU loses comes back by a copy while the tier
still keeps it: such a miss is priced at the cheaper of its re-prefill and its measured load, and it is
not protected on the GPU. The tier copies what the GPU holds (it is inclusive), so the two together
hold the larger of the two, not their sum: the sessions in flight are capped to that, and past it the
tier thrashes as the GPU would. A session waiting to enter flight (new, or back from quiet) waits at
most `first_wait_s`, then goes past the cap into vLLM's least-recently-used order: none is starved.

The model of the cache is a prediction (vLLM's order replayed from the turns sent). Where vLLM's own KV
events are read (`observed`, cache_events.py), what each session keeps on the GPU and in the CPU tier is
taken from them instead, a few times a second, for every session not running a turn.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from server.admission.cache_events import CPU, GPU, CacheEvents

# A session is hot until its usual gap between turns, with this margin, has passed: think times vary.
HOT_MARGIN = 2.0
# Weight of the newest gap in a session's running estimate: rhythms drift, one odd gap should not.
GAP_WEIGHT = 0.5
# Sessions whose rhythm is remembered; past this the least recently seen are forgotten.
MAX_RHYTHMS = 4096
# Gaps of other sessions a new session's rhythm is guessed from (their median).
RECENT_GAPS = 64
# A turn that must prefill its context anew goes only with room left for the sessions ahead of it to grow
# this many more turns, so that it is not squeezed out again (and re-prefilled again) a few turns later.
GROWTH_TURNS = 4
# How often the model of the cache is corrected from vLLM's KV events: a wait is weighed in seconds, and a
# correction recounts every session's chain.
GROUND_S = 0.25


@dataclass
class _Resident:
    blocks: int  # what the session's last turn left in the cache
    last_used: float  # when its last turn ended (or started, while one runs)
    running: int = 0


@dataclass
class _Rhythm:
    ended: float | None = None  # when its last turn ended
    gap_s: float | None = None  # its usual time between a reply and its next turn
    blocks: int = 0  # its last turn's footprint
    growth: float | None = None  # blocks its context usually grows by from one turn to the next


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
    load_s_per_block: Callable[[], float | None] = lambda: None  # a block back from the tier; None: unmeasured


def offload_blocks(gib: float | None, bytes_per_block: int) -> int:
    """The GPU blocks an offload buffer of `gib` GiB holds (0 when off, or before the engine reports the
    bytes a block takes)."""
    if not gib or bytes_per_block <= 0:
        return 0
    return int(gib * (1 << 30)) // bytes_per_block


class SessionAdmission:
    def __init__(self, costs: Costs, hot_s: float, max_wait_s: float, wait_per_prefill: float = 1.0,
                 poll_s: float = 0.02, clock: Callable[[], float] = time.monotonic,
                 first_wait_s: float | None = None, observed: CacheEvents | None = None) -> None:
        """`first_wait_s`: the longest a session entering flight waits (None: max_wait_s); `observed`:
        vLLM's KV events, read into what the cache holds (None: the model's own prediction alone)."""
        self.costs = costs
        self.hot_s = hot_s
        self.max_wait_s = max_wait_s
        self.first_wait_s = max_wait_s if first_wait_s is None else min(first_wait_s, max_wait_s)
        self.wait_per_prefill = wait_per_prefill
        self.poll_s = poll_s
        self.clock = clock
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # least recently used first
        self._offloaded: OrderedDict[str, int] = OrderedDict()  # the CPU tier, least recently used first
        self._rhythms: OrderedDict[str, _Rhythm] = OrderedDict()
        self._gaps: list[float] = []
        self._flight: dict[str, int] = {}  # sessions that entered flight: their place in line (lower goes first)
        self._tickets = itertools.count()
        self.observed = observed
        self._grounded_at: float | None = None
        self._guessed: set[str] = set()  # sessions whose blocks the model set itself since the last grounding

    def is_resident(self, session_id: str) -> bool:
        return session_id in self._resident

    def resident_blocks(self, session_id: str) -> int:
        """What the model says the cache still holds of the session's prefix."""
        resident = self._resident.get(session_id)
        return resident.blocks if resident is not None else 0

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
        """In flight: a turn running, or one ended within its own think time (with a margin, at most
        hot_s), whether or not the cache still holds its prefix."""
        resident = self._resident.get(session_id)
        if resident is not None and resident.running:
            return True
        rhythm = self._rhythms.get(session_id)
        if rhythm is None or rhythm.ended is None:
            return False
        return now - rhythm.ended < min(self.gap_s(session_id) * HOT_MARGIN, self.hot_s)

    def place_in_line(self, session_id: str, now: float) -> int:
        """A session in flight keeps its place; one new or back from quiet draws the next."""
        place = self._flight.get(session_id)
        return place if place is not None and self.is_hot(session_id, now) else next(self._tickets)

    def back_in_s(self, session_id: str, now: float) -> float:
        """How long until a thinking session's next turn is expected (0: due now)."""
        resident = self._resident[session_id]
        return max(resident.last_used + self.gap_s(session_id) - now, 0.0)

    def _observe_start(self, session_id: str, now: float, blocks: int) -> None:
        rhythm = self._rhythms.pop(session_id, None) or _Rhythm()
        if rhythm.ended is not None:
            gap = now - rhythm.ended
            rhythm.gap_s = gap if rhythm.gap_s is None else GAP_WEIGHT * gap + (1 - GAP_WEIGHT) * rhythm.gap_s
            self._gaps = [*self._gaps[-(RECENT_GAPS - 1):], gap]
        if rhythm.blocks:
            grown = max(blocks - rhythm.blocks, 0)
            rhythm.growth = grown if rhythm.growth is None else GAP_WEIGHT * grown + (1 - GAP_WEIGHT) * rhythm.growth
        rhythm.blocks = blocks
        self._rhythms[session_id] = rhythm
        while len(self._rhythms) > MAX_RHYTHMS:
            self._rhythms.popitem(last=False)

    # ----- the decision -----

    def taken_by(self, session_id: str, blocks: int) -> dict[str, int]:
        """The blocks this session's turn of `blocks` would take from other sessions' cached prefixes if it
        went now, least recently used first (vLLM's order), each prefix from its tail; running turns'
        blocks are in use and never taken."""
        capacity = self.costs.capacity_blocks()
        if capacity <= 0:
            return {}
        over = sum(r.blocks for sid, r in self._resident.items() if sid != session_id) + blocks - capacity
        return self._cuts(over, session_id)

    def _cuts(self, over: int, spared: str | None = None) -> dict[str, int]:
        """The blocks vLLM reuses to find `over` more: least recently used prefixes first, each from its
        tail (it frees a request's blocks in reverse), never a running turn's nor `spared`'s."""
        taken: dict[str, int] = {}
        for sid, resident in self._resident.items():
            if over <= 0:
                break
            if sid == spared or resident.running:
                continue
            taken[sid] = min(resident.blocks, over)
            over -= taken[sid]
        return taken

    def evicted_by(self, session_id: str, blocks: int) -> list[str]:
        """The sessions whose prefix this session's turn of `blocks` would cut if it went now, least
        recently used first."""
        return list(self.taken_by(session_id, blocks))

    def protected_by(self, session_id: str, blocks: int) -> list[str]:
        """The evictions worth avoiding: hot sessions whose prefix no offload tier keeps."""
        now = self.clock()
        return [sid for sid in self.evicted_by(session_id, blocks)
                if self.is_hot(sid, now) and sid not in self._offloaded]

    def in_flight(self, now: float) -> list[str]:
        """The sessions in flight, in their order in line (those gone quiet leave it)."""
        for sid in [sid for sid in self._flight if not self.is_hot(sid, now)]:
            del self._flight[sid]
        return sorted(self._flight, key=self._flight.__getitem__)

    def miss_s_per_block(self, session_id: str, per_block: float) -> float:
        """What a block of the session's prefix costs once the GPU has lost it: its re-prefill, or its
        load from the CPU tier while that keeps it, if cheaper (and measured)."""
        load = self.costs.load_s_per_block() if session_id in self._offloaded else None
        return per_block if load is None else min(per_block, load)

    def drowning(self, session_id: str, blocks: int, per_block: float) -> bool:
        """Whether bringing back every session in flight (this one with them) would take the engine longer
        than a session's usual gap: then evictions cascade and thrashing slows everyone."""
        flight = {sid: self.resident_blocks(sid) for sid in self.in_flight(self.clock())}
        flight[session_id] = max(flight.get(session_id, 0), blocks)
        cost = sum(b * self.miss_s_per_block(sid, per_block) for sid, b in flight.items())
        return cost * self.wait_per_prefill > self.gap_s(session_id)

    def footprint(self, session_id: str) -> int:
        """The blocks the session's context takes: what its last turn left, or what the cache still holds."""
        rhythm = self._rhythms.get(session_id)
        return max(self.resident_blocks(session_id), rhythm.blocks if rhythm is not None else 0)

    def fits_in_line(self, session_id: str, blocks: int, place: int | None = None) -> bool:
        """Whether the turn can go without cutting the prefix of a session in flight ahead of it (one no
        offload tier keeps): its context fits beside theirs, and what it takes in vLLM's least-recently-
        used order comes from others. A turn that must prefill most of its context anew also leaves those
        sessions room to grow for GROWTH_TURNS turns. `place` None: the last in line. The first in line
        always goes."""
        ahead = [sid for sid in self.in_flight(self.clock()) if sid != session_id
                 and (place is None or self._flight[sid] < place)]
        if not ahead:
            return True
        protected = {sid for sid in ahead if sid not in self._offloaded}
        running = {sid for sid in ahead if sid in self._resident and self._resident[sid].running}
        held: float = sum(self.resident_blocks(sid) for sid in protected | running)
        if 2 * self.resident_blocks(session_id) < blocks:
            held += GROWTH_TURNS * sum(self._rhythms[sid].growth or 0.0 for sid in protected if sid in self._rhythms)
        capacity = self.costs.capacity_blocks()
        if held + blocks > capacity:
            return False
        tier = self.costs.offload_blocks()
        if tier > 0 and sum(self.footprint(sid) for sid in ahead) + blocks > max(tier, capacity):
            return False  # past what the two tiers hold together: a context brought back evicts another
        return not protected & self.taken_by(session_id, blocks).keys()

    def hold_s(self, session_id: str, blocks: int, waited_s: float, place: int | None = None,
               limit_s: float | None = None) -> float:
        """How much longer the turn may still wait; 0: let it go. `place`: its place in line (None: the
        last); `limit_s`: the longest it may wait (None: max_wait_s). When re-prefill would drown the
        engine, it waits until it fits beside the sessions ahead of it; otherwise a cold turn waits for the
        hot sessions it would evict while the wait paid and still to come is under the prefill those
        sessions would redo."""
        limit = self.max_wait_s if limit_s is None else limit_s
        self._ground()
        per_block = self.costs.prefill_s_per_block()
        if per_block is None or waited_s >= limit or self.costs.capacity_blocks() <= 0:
            return 0.0
        if self.drowning(session_id, blocks, per_block):
            return 0.0 if self.fits_in_line(session_id, blocks, place) else limit - waited_s
        if self.is_resident(session_id):
            return 0.0
        return self._hold_for_return(session_id, blocks, waited_s, per_block, limit)

    def _hold_for_return(self, session_id: str, blocks: int, waited_s: float, per_block: float,
                         limit: float) -> float:
        protected = self.protected_by(session_id, blocks)
        if not protected:
            return 0.0
        now = self.clock()
        saved = sum(self._resident[sid].blocks for sid in protected) * per_block * self.wait_per_prefill
        until_back = max(self.back_in_s(sid, now) for sid in protected)
        if waited_s + until_back > saved:
            return 0.0
        return min(saved, limit) - waited_s

    async def admit(self, session_id: str, blocks: int) -> Admitted:
        """Wait while holding the turn back pays (at most max_wait_s, first_wait_s for a session entering
        flight); it is then counted as running."""
        start = self.clock()
        entering = session_id not in self._flight or not self.is_hot(session_id, start)
        limit = self.first_wait_s if entering else self.max_wait_s
        place = self.place_in_line(session_id, start)
        self._observe_start(session_id, start, blocks)  # its think time ends when it asks, not when it is let in
        waited = timed_out = False
        while self.hold_s(session_id, blocks, self.clock() - start, place, limit) > 0:
            waited = True
            await asyncio.sleep(self.poll_s)
        if waited:
            timed_out = self.clock() - start >= limit
        hot = self.is_resident(session_id)  # its prefix is (still) cached as it goes
        self._enter(session_id, blocks, place)
        return Admitted(self.clock() - start if waited else 0.0, hot, timed_out)

    # ----- the model of the cache -----

    def _enter(self, session_id: str, blocks: int, place: int) -> None:
        now = self.clock()
        self._flight[session_id] = place
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
        self._guess(session_id)
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

    def _ground(self) -> None:
        """Take what each session not running a turn keeps in each tier from vLLM's KV events, at most
        every GROUND_S, for the sessions an event touched or the model guessed since: a session the
        engine still holds comes back into the model (as least recently used), one it freed leaves it."""
        events, now = self.observed, self.clock()
        if events is None or not events.trusted or (
                self._grounded_at is not None and now - self._grounded_at < GROUND_S):
            return
        self._grounded_at = now
        tiered = self.costs.offload_blocks() > 0
        sessions, self._guessed = events.take_touched() | self._guessed, set()
        for sid in sessions:
            resident = self._resident.get(sid)
            if resident is not None and resident.running:
                self._guessed.add(sid)  # its blocks are in use; the events catch up with its reply as it runs
                continue
            gpu = events.blocks(sid, GPU)
            if gpu is None:
                continue  # no event named it (yet): the model's guess stands
            if resident is not None and gpu:
                resident.blocks = gpu
            elif gpu:
                self._resident[sid] = _Resident(gpu, now)
                self._resident.move_to_end(sid, last=False)
            elif resident is not None:
                del self._resident[sid]
            cpu = (events.blocks(sid, CPU) or 0) if tiered else 0
            if cpu:
                self._offloaded[sid] = cpu
            else:
                self._offloaded.pop(sid, None)

    def _guess(self, session_id: str) -> None:
        """The model changed the session's blocks by its own prediction: the next grounding checks it."""
        if self.observed is not None:
            self._guessed.add(session_id)

    def _evict_past_capacity(self) -> None:
        """Take from the model what vLLM will have reused past the capacity (`_cuts`): a prefix keeps
        its place as it loses its end, and one left with nothing is dropped."""
        capacity = self.costs.capacity_blocks()
        if capacity <= 0:
            return
        for sid, taken in self._cuts(sum(r.blocks for r in self._resident.values()) - capacity).items():
            self._guess(sid)
            resident = self._resident[sid]
            resident.blocks -= taken
            if not resident.blocks:
                del self._resident[sid]
