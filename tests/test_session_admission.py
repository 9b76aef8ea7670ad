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
              max_wait_s: float = 30.0) -> SessionAdmission:
    costs = Costs(lambda: capacity, lambda: per_block, lambda: offload)
    return SessionAdmission(costs, hot_s=5.0, max_wait_s=max_wait_s, poll_s=0.001, clock=clock)


async def turn(gate: SessionAdmission, sid: str, blocks: int) -> None:
    await gate.admit(sid, blocks)
    gate.finished(sid)


async def three_agents(gate: SessionAdmission, clock: Clock) -> None:
    """a, b, c (30 blocks each) take a turn at 0 s and again at 1 s: each thinks about 1 s."""
    for at in (0.0, 1.0):
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
        clock.now = 2.4
        assert gate.is_hot("a", clock.now) and gate.back_in_s("a", clock.now) == 0.0  # due: about to ask
        clock.now = 2.6  # 1.6 s of quiet against a 1 s rhythm: its agent is not coming right back
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
        clock.now = 2.7  # b and c, 1.7 s quiet, have missed their turn: nothing left worth protecting
        await settle()
        admitted = await waiting
        assert admitted.waited_s == pytest.approx(0.9) and not admitted.timed_out and not admitted.hot
        assert gate.is_resident("a") and gate.is_resident("d") and not gate.is_resident("b")

    asyncio.run(run())


def test_no_turn_waits_longer_than_the_prefill_it_spares() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock, per_block=0.02)  # 30 blocks: 0.6 s of prefill
        await three_agents(gate, clock)
        clock.now = 1.5
        assert gate.hold_s("d", 30, 0.0) == pytest.approx(0.6)  # a back in 0.5 s: worth 0.6 s at most
        assert gate.hold_s("d", 30, 0.2) == 0  # 0.2 s paid and 0.5 s to come is more: the turn goes
        clock.now = 1.8
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
        assert admitted.waited_s == 0 and not gate.is_resident("a")

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
