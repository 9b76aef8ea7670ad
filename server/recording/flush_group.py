"""Replies that end together share one wait for XDB's commit.

A reply is durable before the client sees it complete, and the writer's `flush` blocks its caller until
the commit, so the event loop runs it in a thread. asyncio's default pool has a handful of threads (six
on two cores): with 64 streams ending in the same few engine steps, one blocked thread per reply queued
most replies behind the others' commits, each seeing its end delayed by several commits in a row. Here
at most one flush runs, and every reply that ends while it runs shares the next one, which starts when
it returns and covers all their rows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class FlushGroup:
    def __init__(self, flush: Callable[[float], None]) -> None:
        self._flush = flush  # blocks until every row accepted before the call is committed
        self._running: asyncio.Future[None] | None = None
        self._next: asyncio.Future[None] | None = None

    async def flush(self, timeout: float) -> None:
        """Until every row accepted before this call is committed; the writer's FlushTimeout (or
        WriterStopped) as its own flush would raise them."""
        if self._next is None:
            if self._running is None or self._running.done():
                self._running = self._start(timeout)
                await asyncio.shield(self._running)
                return
            # The running flush may have counted its rows before these were accepted: the next one.
            self._next = asyncio.ensure_future(self._after(self._running, timeout))
        await asyncio.shield(self._next)

    async def _after(self, running: asyncio.Future[None], timeout: float) -> None:
        with contextlib.suppress(Exception):  # its outcome is its own waiters' to see
            await running
        # One step, no await: whoever comes after this line waits for the flush after this one.
        self._next, self._running = None, self._start(timeout)
        await self._running

    def _start(self, timeout: float) -> asyncio.Future[None]:
        future = asyncio.ensure_future(asyncio.to_thread(self._flush, timeout))
        # Its waiters may all be gone (cancelled): the outcome is still taken, never left unretrieved.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        return future
