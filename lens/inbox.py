"""Activations that reached the XDB writer, waiting for their tokens.

The side channel and the token stream are two roads from the engine: a token's activations may come
before or after the token itself reaches the writer. The receiver thread puts rows in; the writer takes
them by (request key, output position) as it joins them to token rows. Entries nobody takes (hidden
calls, aborted requests) are dropped after `ttl_s` so the inbox cannot grow without bound; a request
whose rows have all been taken is forgotten at once.

A writer whose tokens' activations have not all come waits for the next delivery (`wait`), woken by
the receiver thread, not by polling, until its deadline or until every sender's messages cover the
time its tokens were made (`covered`): after that the missing rows will not come.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from lens.side_channel import StepActivations

Row = tuple[np.ndarray, np.ndarray]  # (concept index [k'], values [k'])


@dataclass
class _RequestRows:
    rows: dict[int, Row] = field(default_factory=dict)  # position -> (index, values)
    touched: float = 0.0


class ActivationInbox:
    def __init__(self, ttl_s: float = 120.0) -> None:
        self.ttl_s = ttl_s
        self.source: str | None = None  # what the worker measures, from its first message
        self.hidden_k = 0  # each row's last slots that are hidden concepts' (from its last message)
        self._requests: dict[str, _RequestRows] = {}
        self._delivered = threading.Condition()
        self._deliveries = 0  # messages put so far: a waiter sleeps until this moves
        self._last_eviction = time.monotonic()
        self._covers: dict[str, tuple[float, float]] = {}  # sender -> (what it covers, monotonic time heard)

    def put(self, step: StepActivations) -> None:
        now = time.monotonic()
        with self._delivered:
            self.source = step.source
            self.hidden_k = step.hidden_k
            for i, (key, position) in enumerate(zip(step.keys, step.positions)):
                request = self._requests.get(key)
                if request is None:
                    request = self._requests[key] = _RequestRows()
                # Copies: a view would keep the whole message's buffer alive while one row waits.
                request.rows[position] = (step.concept_index[i].copy(), step.concept_values[i].copy())
                request.touched = now
            if step.sender:
                self._covers[step.sender] = (max(step.covers, self._covers.get(step.sender, (0.0, 0.0))[0]), now)
            self._deliveries += 1
            self._delivered.notify_all()

    def covered(self, made_at: float) -> bool:
        """Every sender heard from has shipped every row it took up to `made_at` (time.time())."""
        with self._delivered:
            return bool(self._covers) and all(covers >= made_at for covers, _ in self._covers.values())

    @property
    def deliveries(self) -> int:
        """How many messages have been put; taken before looking for rows, then given to `wait`, so a
        message put between the look and the wait still wakes the waiter."""
        with self._delivered:
            return self._deliveries

    def wait(self, seen: int, timeout: float) -> bool:
        """Until a message beyond the first `seen` has been put, at most `timeout` seconds; False on
        timeout."""
        with self._delivered:
            return self._delivered.wait_for(lambda: self._deliveries > seen, timeout)

    def take(self, key: str, positions: list[int]) -> list[Row | None]:
        """Remove and return the (concept index, values) rows of `positions` of one request; None
        where they have not arrived. A request left with no rows is forgotten (rows that come later
        start it again)."""
        with self._delivered:
            request = self._requests.get(key)
            if request is None:
                return [None] * len(positions)
            taken = [request.rows.pop(p, None) for p in positions]
            if not request.rows:
                del self._requests[key]
            return taken

    def has(self, key: str, position: int) -> bool:
        with self._delivered:
            request = self._requests.get(key)
            return request is not None and position in request.rows

    def evict_stale(self) -> None:
        now = time.monotonic()
        if now - self._last_eviction < min(10.0, self.ttl_s):
            return
        self._last_eviction = now
        with self._delivered:
            for key in [k for k, r in self._requests.items() if now - r.touched > self.ttl_s]:
                del self._requests[key]
            # A sender silent this long has stopped (a restarted engine's worker is another sender).
            for sender in [s for s, (_, heard) in self._covers.items() if now - heard > self.ttl_s]:
                del self._covers[sender]

    def __len__(self) -> int:
        with self._delivered:
            return len(self._requests)
