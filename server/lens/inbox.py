"""Activations that reached the API process, waiting for their tokens.

The side channel and the token stream are two roads from the worker: a token's activations may come
before or after the token itself. The receiver thread puts rows in; a reply's token stream takes them
by (request key, output position). Entries nobody takes (hidden calls, aborted requests) are dropped
after `ttl_s` so the inbox cannot grow without bound.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from server.lens.side_channel import StepActivations


@dataclass
class _Request:
    rows: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # position -> (index, values)
    touched: float = 0.0


@dataclass
class Taken:
    """What `take` found for a run of positions: `found[i]` says whether position i had activations."""

    found: np.ndarray  # bool [n]
    concept_index: np.ndarray  # int32 [n, k]; -1 where not found
    concept_values: np.ndarray  # float32 [n, k]; 0 where not found


class ActivationInbox:
    def __init__(self, k: int, ttl_s: float = 120.0) -> None:
        self.k = k
        self.ttl_s = ttl_s
        self.source: str | None = None  # what the worker measures, from its first message
        self._requests: dict[str, _Request] = {}
        self._lock = threading.Lock()
        self._last_eviction = time.monotonic()

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

    def take(self, key: str, positions: range) -> Taken:
        """Remove and return the activations of `positions` of one request (those that have arrived)."""
        n = len(positions)
        found = np.zeros(n, dtype=bool)
        index = np.full((n, self.k), -1, dtype=np.int32)
        values = np.zeros((n, self.k), dtype=np.float32)
        with self._lock:
            request = self._requests.get(key)
            if request is not None:
                for i, position in enumerate(positions):
                    row = request.rows.pop(position, None)
                    if row is not None:
                        width = min(len(row[0]), self.k)
                        index[i, :width], values[i, :width] = row[0][:width], row[1][:width]
                        found[i] = True
        return Taken(found, index, values)

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
