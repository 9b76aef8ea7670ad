"""Activations that reached the API process, waiting for their tokens.

The side channel and the token stream are two roads from the worker: a token's activations may come
before or after the token itself. The receiver thread puts rows in; a reply's token stream takes them
by (request key, output position). Entries nobody takes (hidden calls, aborted requests) are dropped
after `ttl_s` so the inbox cannot grow without bound.

A reply that has ended waits for its last rows on the event loop (`delivery`), woken by the receiver
thread when a message has been put, not by polling: replies that end together would otherwise poll
the inbox hundreds of times a second between them, stalling the streams still going.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from server.capture.side_channel import StepActivations


@dataclass
class _Request:
    rows: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # position -> (index, values)
    touched: float = 0.0


class ActivationInbox:
    def __init__(self, k: int, ttl_s: float = 120.0) -> None:
        self.k = k
        self.ttl_s = ttl_s
        self.source: str | None = None  # what the worker measures, from its first message
        self._requests: dict[str, _Request] = {}
        self._lock = threading.Lock()
        self._last_eviction = time.monotonic()
        # Asks the receiver to deliver what has arrived now (a reply is waiting for its last rows).
        self.wake: Callable[[], None] = lambda: None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def put(self, step: StepActivations) -> None:
        now = time.monotonic()
        self.source = step.source
        with self._lock:
            for i, (key, position) in enumerate(zip(step.keys, step.positions)):
                request = self._requests.get(key)
                if request is None:
                    request = self._requests[key] = _Request()
                request.rows[position] = (step.concept_index[i], step.concept_values[i])
                request.touched = now
            waiters, self._waiters = self._waiters, []
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for loop, future in waiters:
            if not future.done():  # a waiter done with waiting cancels its own
                by_loop.setdefault(loop, []).append(future)
        for loop, futures in by_loop.items():  # one wake-up of each loop, however many wait
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, futures)

    def delivery(self) -> asyncio.Future[None]:
        """Done when the next message has been put. Taken before looking for rows, so a message put
        between the look and the wait still wakes the waiter."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.append((loop, future))
        return future

    def take(self, key: str, positions: list[int]) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Remove and return the (concept index, values) rows of `positions` of one request; None
        where they have not arrived."""
        with self._lock:
            request = self._requests.get(key)
            if request is None:
                return [None] * len(positions)
            return [request.rows.pop(p, None) for p in positions]

    def has(self, key: str, position: int) -> bool:
        with self._lock:
            request = self._requests.get(key)
            return request is not None and position in request.rows

    def discard(self, key: str) -> None:
        """Forget a request (its reply is complete); late rows for it are evicted by age."""
        with self._lock:
            self._requests.pop(key, None)

    def evict_stale(self) -> None:
        now = time.monotonic()
        if now - self._last_eviction < min(10.0, self.ttl_s):
            return
        self._last_eviction = now
        with self._lock:
            for key in [k for k, r in self._requests.items() if now - r.touched > self.ttl_s]:
                del self._requests[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._requests)


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
