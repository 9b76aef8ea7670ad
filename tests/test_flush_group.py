"""Replies ending together share one flush thread: at most one runs, the next covers everyone who
arrived while it ran, and none returns before a flush that started after its call."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from server.recording.flush_group import FlushGroup
from xdb.writer import FlushTimeout


class SlowWriter:
    """A writer whose flush takes `seconds` and records when each began and ended."""

    def __init__(self, seconds: float = 0.1, fail: bool = False) -> None:
        self.seconds, self.fail = seconds, fail
        self.flushes: list[tuple[float, float]] = []
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def flush(self, timeout: float) -> None:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        began = time.monotonic()
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1
            self.flushes.append((began, time.monotonic()))
        if self.fail:
            raise FlushTimeout("XDB flush: 3 rows still uncommitted")


def test_replies_ending_together_share_two_flushes_and_each_is_covered() -> None:
    writer = SlowWriter(0.3)
    group = FlushGroup(writer.flush)

    async def reply(delay: float) -> tuple[float, float]:
        await asyncio.sleep(delay)
        called = time.monotonic()
        await group.flush(10.0)
        return called, time.monotonic()

    async def run() -> list[tuple[float, float]]:
        return await asyncio.gather(*(reply(i * 0.002) for i in range(40)))

    calls = asyncio.run(run())
    assert writer.most_at_once == 1
    assert len(writer.flushes) == 2  # forty replies within one flush: it, and one for them all
    for called, returned in calls:  # each waited for a flush that began after its own rows
        assert any(began >= called - 0.001 and ended <= returned for began, ended in writer.flushes)


def test_a_flush_after_the_last_one_finished_starts_its_own() -> None:
    writer = SlowWriter(0.02)
    group = FlushGroup(writer.flush)

    async def run() -> None:
        await group.flush(10.0)
        await group.flush(10.0)

    asyncio.run(run())
    assert len(writer.flushes) == 2


def test_every_reply_sharing_a_flush_sees_its_timeout() -> None:
    group = FlushGroup(SlowWriter(0.05, fail=True).flush)

    async def run() -> list[BaseException | None]:
        return await asyncio.gather(*(group.flush(1.0) for _ in range(5)), return_exceptions=True)

    outcomes = asyncio.run(run())
    assert all(isinstance(o, FlushTimeout) for o in outcomes), outcomes


def test_a_cancelled_waiter_leaves_the_flush_to_the_others() -> None:
    writer = SlowWriter(0.1)
    group = FlushGroup(writer.flush)

    async def run() -> None:
        first = asyncio.create_task(group.flush(10.0))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(group.flush(10.0))
        await asyncio.sleep(0.01)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await second

    asyncio.run(run())
    assert len(writer.flushes) == 2  # the cancelled waiter's flush ran on, and the second's after it
