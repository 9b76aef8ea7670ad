"""Session-aware admission, on a model cache of 100 blocks, a prefill price the test sets and a clock
the test moves."""

from __future__ import annotations

import asyncio

import pytest

from server.admission.prefill_cost import PrefillCost
from server.admission.session_admission import Costs, SessionAdmission


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


DEAR = 0.1  # seconds to prefill a block: a 30-block prefix costs 3 s to recompute
CHEAP = 0.001  # 30 blocks in 30 ms: not worth any wait


def admission(clock: Clock, capacity: int = 100, per_block: float | None = DEAR, offload: int = 0,
              max_wait_s: float = 30.0, load: float | None = None,
              first_wait_s: float | None = None) -> SessionAdmission:
    costs = Costs(lambda: capacity, lambda: per_block, lambda: offload, lambda: load)
    return SessionAdmission(costs, hot_s=5.0, max_wait_s=max_wait_s, poll_s=0.001, clock=clock,
                            first_wait_s=first_wait_s)


async def turn(gate: SessionAdmission, sid: str, blocks: int) -> None:
    await gate.admit(sid, blocks)
    gate.finished(sid)


async def three_agents(gate: SessionAdmission, clock: Clock, gap_s: float = 1.0) -> None:
    """a, b, c (30 blocks each) take a turn at 0 s and again at `gap_s`: each thinks that long."""
    for at in (0.0, gap_s):
        clock.now = at
        for sid in "abc":
            await turn(gate, sid, 30)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.002)


def test_a_working_set_that_fits_goes_at_once() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        await three_agents(gate, clock)
        assert all(gate.is_resident(s) for s in "abc")
        again = await gate.admit("a", 30)  # its prefix is in the cache
        assert again.hot and again.waited_s == 0

    asyncio.run(run())


def test_a_session_is_hot_for_its_own_think_time_not_a_fixed_window() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        await three_agents(gate, clock)
        assert gate.gap_s("a") == pytest.approx(1.0)
        assert gate.gap_s("new") == pytest.approx(1.0)  # a stranger is guessed from the others
        clock.now = 2.9
        assert gate.is_hot("a", clock.now) and gate.back_in_s("a", clock.now) == 0.0  # due: about to ask
        clock.now = 3.1  # 2.1 s of quiet against a 1 s rhythm: its agent is not coming right back
        assert not gate.is_hot("a", clock.now)

    asyncio.run(run())


def test_a_cold_turn_waits_for_the_agent_about_to_return_when_its_prefill_is_dear() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        await three_agents(gate, clock)
        clock.now = 1.8  # a is due back at 2.0
        assert gate.evicted_by("d", 30) == ["a"] and gate.protected_by("d", 30) == ["a"]
        assert gate.hold_s("d", 30, 0.0) > 0  # 0.2 s to wait against 3 s of prefill spared
        waiting = asyncio.create_task(gate.admit("d", 30))
        await settle()
        assert not waiting.done()
        clock.now = 2.0
        back = await gate.admit("a", 30)  # the agent it waited for: a cache hit, not held by the waiter
        assert back.hot and back.waited_s == 0
        gate.finished("a")
        clock.now = 3.2  # b and c, 2.2 s quiet, have missed their turn: nothing left worth protecting
        await settle()
        admitted = await waiting
        assert admitted.waited_s == pytest.approx(1.4) and not admitted.timed_out and not admitted.hot
        assert gate.is_resident("a") and gate.is_resident("d")
        assert gate.resident_blocks("b") == 10 and gate.resident_blocks("c") == 30  # b lost its tail to d

    asyncio.run(run())


def test_no_turn_waits_longer_than_the_prefill_it_spares() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock, per_block=0.02)  # 30 blocks: 0.6 s of prefill
        await three_agents(gate, clock, gap_s=4.0)  # all four re-prefilled: 2.4 s, under the 4 s gap
        clock.now = 7.5
        assert not gate.drowning("d", 30, 0.02)
        assert gate.hold_s("d", 30, 0.0) == pytest.approx(0.6)  # a back in 0.5 s: worth 0.6 s at most
        assert gate.hold_s("d", 30, 0.2) == 0  # 0.2 s paid and 0.5 s to come is more: the turn goes
        clock.now = 7.8
        assert gate.hold_s("d", 30, 0.3) == pytest.approx(0.3)  # 0.3 s paid and 0.2 s to come is under
        assert gate.hold_s("d", 30, 0.45) == 0

    asyncio.run(run())


@pytest.mark.parametrize("per_block", [CHEAP, None])
def test_a_cheap_or_unmeasured_prefill_holds_nothing(per_block: float | None) -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock, per_block=per_block)
        await three_agents(gate, clock)
        clock.now = 1.5  # a is back in 0.5 s, but recomputing its 30 blocks takes 30 ms (or is unknown)
        admitted = await gate.admit("d", 30)
        assert admitted.waited_s == 0 and gate.resident_blocks("a") == 10  # d took 20 of its blocks

    asyncio.run(run())


def test_nobody_waits_longer_than_max_wait() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock, per_block=10.0, max_wait_s=4.0)
        await three_agents(gate, clock)
        clock.now = 1.9
        await gate.admit("a", 30)  # a turn that keeps running: never evicted, always hot
        gate.finished("b")
        waiting = asyncio.create_task(gate.admit("d", 50))  # would evict b and c, each due back
        await settle()
        assert not waiting.done()
        clock.now = 5.9
        await settle()
        admitted = await waiting
        assert admitted.timed_out and admitted.waited_s == pytest.approx(4.0)
        assert gate.is_resident("a")  # a running turn's blocks are not evicted, whatever the model says

    asyncio.run(run())


def test_a_small_turn_that_fits_goes_past_a_large_one_that_waits() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        await three_agents(gate, clock)  # 90 of 100 blocks held
        clock.now = 1.8
        large = asyncio.create_task(gate.admit("x", 40))
        await settle()
        small = await gate.admit("y", 10)  # fits without evicting anyone: no head-of-line blocking
        assert small.waited_s == 0 and not large.done()
        clock.now = 3.0  # everyone has gone quiet
        await settle()
        assert (await large).waited_s == pytest.approx(1.2)

    asyncio.run(run())


def test_a_prefix_the_offload_tier_keeps_is_not_protected() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock, offload=200)  # the CPU tier holds every session's last turn
        await three_agents(gate, clock)
        clock.now = 1.8
        assert gate.is_offloaded("a") and gate.evicted_by("d", 30) == ["a"]
        assert gate.protected_by("d", 30) == []  # restored by a copy when a is back
        assert (await gate.admit("d", 30)).waited_s == 0

    asyncio.run(run())


def test_an_offload_tier_too_small_keeps_only_the_most_recent() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock, offload=60)  # two sessions' worth: the least recently used dropped first
        await three_agents(gate, clock)
        assert [gate.is_offloaded(s) for s in "abc"] == [False, True, True]
        clock.now = 1.8
        assert gate.protected_by("d", 30) == ["a"]  # a's prefix would be lost on both tiers

    asyncio.run(run())


def test_without_a_known_cache_nothing_is_held() -> None:
    async def run() -> None:
        gate = admission(Clock(), capacity=0)
        await gate.admit("a", 10_000)
        assert (await gate.admit("b", 10_000)).waited_s == 0

    asyncio.run(run())


@pytest.mark.parametrize("blocks", [120, 100])
def test_a_session_larger_than_the_cache_is_not_held_forever(blocks: int) -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        admitted = await gate.admit("huge", blocks)  # nothing to evict: it goes (the VRAM governor decides)
        assert admitted.waited_s == 0

    asyncio.run(run())


def test_prefill_cost_counts_only_long_prefills() -> None:
    cost = PrefillCost()
    cost.observe(10, 0.05)  # a cache hit's last few tokens: mostly the step's fixed cost
    assert cost.s_per_block(32) is None
    cost.observe(1000, 0.1)
    assert cost.s_per_block(32) == pytest.approx(32 * 1e-4)
    cost.observe(1000, 0.2)  # a running estimate, not the last sample
    assert 1e-4 < (cost.s_per_token or 0) < 2e-4


# ----- when re-prefill would drown the engine: the cache goes to sessions in their order in line -----

def test_sessions_in_flight_are_capped_to_what_the_cache_holds() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)  # a, b, c and d re-prefilled: 12 s of prefill against a 1 s gap
        await three_agents(gate, clock)
        clock.now = 1.2
        assert gate.drowning("d", 30, DEAR)
        assert gate.in_flight(clock.now) == ["a", "b", "c"]
        waiting = asyncio.create_task(gate.admit("d", 30))  # a fourth context does not fit beside them
        await settle()
        assert not waiting.done()
        for at in (2.0, 3.0):  # the three keep their turns coming: d waits for one to finish its job
            clock.now = at
            for sid in "abc":
                assert (await gate.admit(sid, 30)).waited_s == 0
                gate.finished(sid)
            await settle()
            assert not waiting.done()
        clock.now = 4.0
        for sid in "ab":  # c's job is done: it goes quiet after its own 1 s rhythm, with a margin
            await turn(gate, sid, 30)
        clock.now = 5.1
        await settle()
        admitted = await waiting
        assert admitted.waited_s == pytest.approx(3.9) and not admitted.timed_out
        assert gate.in_flight(clock.now) == ["a", "b", "d"]

    asyncio.run(run())


def test_the_youngest_session_waits_when_older_ones_grow() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        await three_agents(gate, clock)
        clock.now = 2.0
        assert (await gate.admit("a", 50)).waited_s == 0  # the oldest grows: 50 + 30 + 30 over 100
        gate.finished("a")
        assert (await gate.admit("b", 30)).waited_s == 0  # 50 + 30 ahead of it and its own fit
        gate.finished("b")
        youngest = asyncio.create_task(gate.admit("c", 30))
        await settle()
        assert not youngest.done()  # its 30 blocks do not fit beside a's 50 and b's 30
        clock.now = 3.0
        await turn(gate, "b", 30)
        clock.now = 4.1  # a has gone quiet: c is second in line now
        await settle()
        assert (await youngest).waited_s == pytest.approx(2.1)

    asyncio.run(run())


def test_a_session_back_from_quiet_queues_from_now() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        await three_agents(gate, clock)
        clock.now = 1.2
        assert [gate.place_in_line(sid, clock.now) for sid in "abc"] == [0, 1, 2]  # kept from their first turns
        clock.now = 9.0
        assert gate.place_in_line("a", clock.now) == 3  # quiet: it queues behind anyone in line now

    asyncio.run(run())


def test_a_turn_waits_rather_than_cut_the_prefix_of_an_older_session_least_recently_used() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        for at in (0.0, 0.8):  # a: in flight for 1.6 s after each turn
            clock.now = at
            await turn(gate, "a", 40)
        for at in (0.9, 1.0):  # q: a quick rhythm, quiet from 1.2 s, but used after a
            clock.now = at
            await turn(gate, "q", 30)
        clock.now = 1.5
        assert gate.in_flight(clock.now) == ["a"]
        assert gate.taken_by("d", 60) == {"a": 30}  # vLLM reuses a's blocks first: least recently used
        waiting = asyncio.create_task(gate.admit("d", 60))  # 40 + 60 fit, but not in that order
        await settle()
        assert not waiting.done()
        clock.now = 2.0
        await turn(gate, "a", 40)  # a is back: its blocks are the most recently used now
        await settle()
        assert (await waiting).waited_s == pytest.approx(0.5)
        assert gate.resident_blocks("a") == 40 and not gate.is_resident("q")

    asyncio.run(run())


def test_a_cold_turn_leaves_the_sessions_ahead_room_to_grow() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        for at, blocks in ((0.0, 20), (1.0, 25)):  # a and b grow 5 blocks a turn
            clock.now = at
            for sid in "ab":
                await turn(gate, sid, blocks)
        clock.now = 1.5
        assert gate.fits_in_line("d", 10)  # 25 + 25, 4 turns x 5 blocks each to grow into, and 10: the brim
        assert not gate.fits_in_line("d", 11)
        waiting = asyncio.create_task(gate.admit("d", 45))  # cold: 25 + 25 + 4 turns x 5 x 2 + 45 > 100
        await settle()
        assert not waiting.done()
        clock.now = 2.0
        await turn(gate, "a", 30)
        clock.now = 3.1  # b has gone quiet: a alone ahead, 30 + 4 x 5 + 45 fit
        await settle()
        assert (await waiting).waited_s == pytest.approx(1.6)

    asyncio.run(run())


# ----- with vLLM's CPU tier -----

def test_a_miss_the_cpu_tier_serves_is_priced_at_its_load() -> None:
    """Four 30-block sessions in flight re-prefilled at 10 ms a block: 1.2 s against a 1 s gap, drowning.
    Three of them in the tier, loaded at 1 ms a block, and d's own prefill cost 0.39 s: room enough."""
    async def run() -> None:
        prefill = 0.01
        clock = Clock()
        dear = admission(clock, per_block=prefill)
        await three_agents(dear, clock)
        clock.now = 1.2
        assert dear.drowning("d", 30, prefill)
        clock = Clock()
        tiered = admission(clock, per_block=prefill, offload=400, load=0.001)
        await three_agents(tiered, clock)
        clock.now = 1.2
        assert tiered.miss_s_per_block("a", prefill) == 0.001 and tiered.miss_s_per_block("d", prefill) == prefill
        assert not tiered.drowning("d", 30, prefill)
        assert (await tiered.admit("d", 30)).waited_s == 0
        unmeasured = admission(Clock(), offload=400)  # no load measured yet: the re-prefill's price
        assert unmeasured.miss_s_per_block("a", DEAR) == DEAR

    asyncio.run(run())


def test_sessions_in_flight_are_capped_to_what_the_two_tiers_hold_together() -> None:
    """A 100-block GPU and a 120-block tier: vLLM's tier copies what the GPU holds, so together they
    hold 120 blocks, not 220. Three 30-block sessions in flight leave room for a fourth, not a fifth."""
    async def run() -> None:
        clock = Clock()
        gate = admission(clock, offload=120)  # no load measured: misses priced as re-prefill, drowning
        await three_agents(gate, clock)
        clock.now = 1.2
        assert gate.drowning("d", 30, DEAR)
        assert gate.fits_in_line("d", 30)  # 120 blocks: within the larger tier
        d = asyncio.create_task(gate.admit("d", 30))
        await settle()
        assert d.done()
        gate.finished("d")
        assert not gate.fits_in_line("e", 30)  # 150 blocks would thrash the tier too
        clock = Clock()
        without_tier = admission(clock)
        await three_agents(without_tier, clock)
        clock.now = 1.2
        assert not without_tier.fits_in_line("d", 30)  # the GPU alone: 120 blocks do not fit its 100

    asyncio.run(run())


def test_a_session_entering_flight_waits_at_most_its_first_wait() -> None:
    """In flight, sessions may wait up to max_wait_s; one entering waits first_wait_s, then goes past the
    cap (vLLM's least-recently-used order decides what it evicts)."""
    async def run() -> None:
        clock = Clock()
        gate = admission(clock, first_wait_s=2.0)
        await three_agents(gate, clock)
        clock.now = 1.2
        waiting = asyncio.create_task(gate.admit("d", 30))
        await settle()
        assert not waiting.done()
        clock.now = 2.0
        for sid in "abc":  # the three keep their turns coming
            await turn(gate, sid, 30)
        clock.now = 3.2
        await settle()
        admitted = await waiting
        assert admitted.timed_out and admitted.waited_s == pytest.approx(2.0)

    asyncio.run(run())


def test_the_host_load_cost_is_read_from_the_offloading_connectors_stats() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

    from server.admission.host_load_cost import LOAD_BYTES, LOAD_TIME, HostLoadCost

    cost = HostLoadCost()
    cost.observe(None)
    stats = OffloadingConnectorStats()
    stats.increase_counter("vllm:kv_offload_store_bytes", 4e9)  # stores say nothing about a load
    cost.observe(stats.to_dict())
    assert cost.s_per_block(2 << 20) is None
    stats.increase_counter(LOAD_BYTES, 4e9)
    stats.increase_counter(LOAD_TIME, 0.1)
    cost.observe(stats.to_dict())
    assert cost.s_per_block(2 << 20) == pytest.approx((2 << 20) * 0.1 / 4e9)
