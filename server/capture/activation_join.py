"""One completion's generated tokens, held until their activations arrive, then released in order.

Tokens are released as the longest prefix whose activations have all arrived, so rows keep the
order of their ticks. At the reply's end the rest wait a bounded time (without holding the event
loop: woken as rows arrive) and are then released without activations: NULL, never invented. This
runs on the event loop for every token, so it works on plain lists and builds arrays only per
released run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from server.capture.inbox import ActivationInbox

Row = tuple[np.ndarray, np.ndarray]  # (concept index [k'], values [k'])


@dataclass
class Run:
    """Consecutive tokens that all have activations (`concept_index` set) or all lack them (None)."""

    ticks: list[int]
    texts: list[str]
    token_ids: list[int]
    created_at: list[float]  # when each token arrived, epoch seconds
    concept_index: np.ndarray | None  # int32 [n, k]; -1 in slots past a row's k'
    concept_values: np.ndarray | None  # float32 [n, k]


class ActivationJoin:
    def __init__(self, inbox: ActivationInbox, key: str) -> None:
        self.inbox, self.key = inbox, key
        self.first = 0  # output position of the first held token
        self.ticks: list[int] = []
        self.texts: list[str] = []
        self.ids: list[int] = []
        self.times: list[float] = []
        self.rows: list[Row | None] = []

    def hold(self, ticks: list[int], texts: list[str], token_ids: list[int], created_at: list[float]) -> None:
        self.ticks += ticks
        self.texts += texts
        self.ids += token_ids
        self.times += created_at
        self.rows += [None] * len(token_ids)

    def _collect(self) -> None:
        missing = [i for i, row in enumerate(self.rows) if row is None]
        if missing:
            for i, row in zip(missing, self.inbox.take(self.key, [self.first + i for i in missing])):
                self.rows[i] = row

    def ready(self) -> list[Run]:
        """The held tokens whose activations (and all earlier ones') have arrived."""
        if not self.ids:
            return []
        self._collect()
        upto = next((i for i, row in enumerate(self.rows) if row is None), len(self.rows))
        return self._release(upto)

    async def finish(self, wait_s: float) -> list[Run]:
        """Everything held: wait up to `wait_s` for activations in flight, then release all."""
        deadline = time.monotonic() + wait_s
        delivery = self.inbox.delivery()
        runs = self.ready()
        if self.ids:
            self.inbox.wake()
        while self.ids and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(delivery, left)
            except TimeoutError:
                break
            delivery = self.inbox.delivery()
            runs += self.ready()
        delivery.cancel()
        runs += self.release_all()
        self.inbox.discard(self.key)
        return runs

    def release_all(self) -> list[Run]:
        """Everything held, now, with whatever activations have arrived (an aborted reply)."""
        if self.ids:
            self._collect()
        return self._release(len(self.ids))

    def _release(self, upto: int) -> list[Run]:
        runs: list[Run] = []
        start = 0
        while start < upto:
            has = self.rows[start] is not None
            stop = start + 1
            while stop < upto and (self.rows[stop] is not None) == has:
                stop += 1
            # A run with activations has every row set: the filter narrows the type and drops nothing.
            index, values = self._arrays([r for r in self.rows[start:stop] if r is not None]) if has else (None, None)
            runs.append(Run(self.ticks[start:stop], self.texts[start:stop], self.ids[start:stop],
                            self.times[start:stop], index, values))
            start = stop
        self.first += upto
        del self.ticks[:upto], self.texts[:upto], self.ids[:upto], self.times[:upto], self.rows[:upto]
        return runs

    def _arrays(self, rows: list[Row]) -> tuple[np.ndarray, np.ndarray]:
        k = self.inbox.k
        if len(rows) == 1 and len(rows[0][0]) == k:  # a decoding step's one token: no copy, no stack
            return rows[0][0][None], rows[0][1][None]
        if all(len(r[0]) == k for r in rows):  # the usual case: every row has k concepts
            # np.array of equal rows stacks them at a third of np.stack's cost (its checks are Python).
            return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
        index = np.full((len(rows), k), -1, dtype=np.int32)
        values = np.zeros((len(rows), k), dtype=np.float32)
        for i, (idx, val) in enumerate(rows):
            index[i, :len(idx)], values[i, :len(val)] = idx[:k], val[:k]
        return index, values
