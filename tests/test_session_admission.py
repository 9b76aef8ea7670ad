"""Session-aware admission, on a model cache of 100 blocks and a clock the test moves."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.session_admission import SessionAdmission


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def admission(clock: Clock, capacity: int = 100) -> SessionAdmission:
    return SessionAdmission(lambda: capacity, hot_s=5.0, max_wait_s=30.0, poll_s=0.001, clock=clock)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.002)


def test_a_working_set_that_fits_goes_at_once() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        for sid in ("a", "b", "c"):
            assert (await gate.admit(sid, 30)).waited_s == 0
            gate.finished(sid)
        assert all(gate.is_resident(s) for s in "abc")
        again = await gate.admit("a", 30)  # its prefix is in the cache
        assert again.hot and again.waited_s == 0

    asyncio.run(run())


def test_a_cold_session_waits_for_the_hot_one_it_would_evict_to_go_quiet() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        for sid in ("a", "b", "c"):
            await gate.admit(sid, 30)
            gate.finished(sid)
        assert gate.blocked_by("d", 30) == ["a"]  # the least recently used, but it ended a turn just now
        waiting = asyncio.create_task(gate.admit("d", 30))
        await settle()
        assert not waiting.done()
        hot = await gate.admit("b", 30)  # a resident session's next turn is not held up by the waiter
        assert hot.hot and hot.waited_s == 0
        gate.finished("b")
        clock.now = 6.0  # "a" has been quiet for longer than hot_s: its agent is not coming right back
        await settle()
        admitted = await waiting
        assert admitted.waited_s == 6.0 and not admitted.timed_out and not admitted.hot
        assert not gate.is_resident("a") and gate.is_resident("d")  # vLLM reuses a's blocks for d

    asyncio.run(run())


def test_nobody_waits_longer_than_max_wait() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        await gate.admit("busy", 90)  # a turn that keeps running
        waiting = asyncio.create_task(gate.admit("cold", 40))
        await settle()
        assert not waiting.done()
        clock.now = 30.0
        await settle()
        admitted = await waiting
        assert admitted.timed_out and admitted.waited_s == 30.0
        assert gate.is_resident("busy")  # a running turn's blocks are not evicted, whatever the model says

    asyncio.run(run())


def test_the_cold_go_in_the_order_they_came() -> None:
    async def run() -> None:
        clock = Clock()
        gate = admission(clock)
        await gate.admit("a", 60)
        gate.finished("a")
        first = asyncio.create_task(gate.admit("x", 50))
        await settle()
        second = asyncio.create_task(gate.admit("y", 10))  # would fit, but x came first
        await settle()
        assert not first.done() and not second.done()
        clock.now = 6.0
        await settle()
        assert (await first).waited_s == 6.0
        assert (await second).waited_s == 6.0

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
