"""One chat request's life in the orchestrator, as one object.

    async with orchestrator.turn(TurnRequest(spec, messages)) as turn:
        ... send turn.messages to the engine ...
        await turn.commit(reply)
    ... send the reply; once it is out whole: turn.delivered() ...

Entering takes the session's lock (so a session's requests join its State in order) and prepares the
prompt. Leaving without a commit rolls the session back, whatever the reason (an error, a 429, a
client gone). A streamed reply outlives the `async with`: `turn.hand_over()` gives the turn to the
stream's iterator, which must `close()` it when the stream ends. Closing runs the release callbacks
(a VRAM reservation) and frees the lock, exactly once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from orchestrator.cache_report import CacheReport
from orchestrator.prepared import Prepared
from orchestrator.session import SessionHolds, SessionLock
from orchestrator.turn_request import TurnRequest


class TurnDriver(Protocol):
    """The orchestrator's side of a turn."""

    async def prepare(self, request: TurnRequest, force_compaction: bool = False) -> Prepared: ...
    async def shrink(self, prepared: Prepared) -> Prepared | None: ...
    def commit(self, prepared: Prepared, reply: dict[str, Any]) -> Any: ...
    def abandon(self, prepared: Prepared) -> None: ...
    def delivered(self, prepared: Prepared) -> None: ...
    def rollback(self, prepared: Prepared) -> None: ...


class Turn:
    def __init__(self, driver: TurnDriver, request: TurnRequest, lock: SessionLock | None,
                 holds: SessionHolds | None = None) -> None:
        """`lock`: the session's, for a session whose State the server keeps; `holds`: when other processes
        serve the same sessions, a session the client keeps (named, or inferred from its messages) is held
        through them once known, so its records continue where another process's ended."""
        self._driver = driver
        self._request = request
        self._lock = lock
        self._holds = holds if lock is None else None
        self._held: str | None = None
        self._prepared: Prepared | None = None
        self._on_close: list[Callable[[], None]] = []
        self._committed = False
        self._closed = False
        self._handed_over = False

    async def __aenter__(self) -> Turn:
        if self._lock is not None:
            await self._lock.acquire()
        try:
            self._prepared = await self._driver.prepare(self._request)
            if self._holds is not None:
                await self._holds.take(self._prepared.session_id)
                self._held = self._prepared.session_id
        except BaseException:
            self._release_lock()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if not self._handed_over:
            self.close()

    @property
    def prepared(self) -> Prepared:
        if self._prepared is None:
            raise RuntimeError("the turn is used outside its `async with`")
        return self._prepared

    @property
    def report(self) -> CacheReport:
        return self.prepared.report

    @property
    def session_id(self) -> str:
        return self.prepared.session_id

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.prepared.messages

    @property
    def committed(self) -> bool:
        """The reply completed and was committed; a turn closed without one was rolled back."""
        return self._committed

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the turn ends, committed or not (releasing what it holds)."""
        self._on_close.append(callback)

    async def shrink(self) -> bool:
        """Compact the session's State now and re-prepare; False when there was nothing to compact."""
        smaller = await self._driver.shrink(self.prepared)
        if smaller is None:
            return False
        self._prepared = smaller
        return True

    async def commit(self, reply: dict[str, Any]) -> None:
        """The reply completed: it joins the State, durably, before this returns."""
        if self._committed or self._closed:
            raise RuntimeError("a turn is committed at most once, before it is closed")
        self._committed = True
        try:
            receipt = self._driver.commit(self.prepared, reply)
            if isinstance(receipt, concurrent.futures.Future):  # saved on a worker thread
                saving = asyncio.wrap_future(receipt)
                try:
                    await asyncio.shield(saving)
                except asyncio.CancelledError:  # the client left: the save goes on, and its failure counts
                    saving.add_done_callback(self._abandon_unless_saved)
                    raise
        except Exception:  # not saved: the State the next request reads is the stored one
            self._driver.abandon(self.prepared)
            raise

    def delivered(self) -> None:
        """The committed reply went out whole (callable after `close`): a client that sends the turn again
        now sends a turn of its own (orchestrator/turn_retry.py)."""
        if self._committed and self._prepared is not None:
            self._driver.delivered(self._prepared)

    def _abandon_unless_saved(self, saving: asyncio.Future[Any]) -> None:
        if saving.cancelled() or saving.exception() is not None:
            self._driver.abandon(self.prepared)

    def hand_over(self) -> Turn:
        """The `async with` ends but the turn goes on (a streamed reply); the new owner closes it."""
        self._handed_over = True
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not self._committed and self._prepared is not None:
                self._driver.rollback(self._prepared)
            for callback in self._on_close:
                callback()
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        if self._held is not None and self._holds is not None:
            self._holds.give(self._held)
            self._held = None
        if self._lock is not None and self._lock.locked():
            self._lock.release()
            self._lock = None
