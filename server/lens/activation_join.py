"""One completion's generated tokens, held until their activations arrive, then released in order.

Tokens are released as the longest prefix whose activations have all arrived, so rows keep the
order of their ticks. At the reply's end the rest wait a bounded time (off the event loop: an
asyncio sleep) and are then released without activations: NULL, never invented.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from server.lens.inbox import ActivationInbox


@dataclass
class Run:
    """Consecutive tokens that all have activations (`concept_index` set) or all lack them (None)."""

    ticks: list[int]
    texts: list[str]
    token_ids: list[int]
    concept_index: np.ndarray | None
    concept_values: np.ndarray | None


class ActivationJoin:
    def __init__(self, inbox: ActivationInbox, key: str) -> None:
        self.inbox, self.key = inbox, key
        self.first = 0  # output position of the first held token
        self.ticks: list[int] = []
        self.texts: list[str] = []
        self.ids: list[int] = []
        self.found = np.zeros(0, dtype=bool)
        self.index = np.zeros((0, inbox.k), dtype=np.int32)
        self.values = np.zeros((0, inbox.k), dtype=np.float32)

    def hold(self, ticks: list[int], texts: list[str], token_ids: list[int]) -> None:
        n = len(token_ids)
        self.ticks += ticks
        self.texts += texts
        self.ids += token_ids
        self.found = np.concatenate([self.found, np.zeros(n, dtype=bool)])
        self.index = np.concatenate([self.index, np.full((n, self.inbox.k), -1, dtype=np.int32)])
        self.values = np.concatenate([self.values, np.zeros((n, self.inbox.k), dtype=np.float32)])

    def _collect(self) -> None:
        missing = np.flatnonzero(~self.found)
        if len(missing) == 0:
            return
        start = self.first + int(missing[0])
        taken = self.inbox.take(self.key, range(start, self.first + len(self.ids)))
        rows = np.arange(int(missing[0]), len(self.ids))[taken.found]
        self.found[rows] = True
        self.index[rows] = taken.concept_index[taken.found]
        self.values[rows] = taken.concept_values[taken.found]

    def ready(self) -> list[Run]:
        """The held tokens whose activations (and all earlier ones') have arrived."""
        if not self.ids:
            return []
        self._collect()
        missing = np.flatnonzero(~self.found)
        upto = int(missing[0]) if len(missing) else len(self.ids)
        return self._release(upto)

    async def finish(self, wait_s: float) -> list[Run]:
        """Everything held: wait up to `wait_s` for activations in flight, then release all."""
        deadline = time.monotonic() + wait_s
        runs = self.ready()
        while self.ids and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            runs += self.ready()
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
            has = bool(self.found[start])
            stop = start + 1
            while stop < upto and bool(self.found[stop]) == has:
                stop += 1
            runs.append(Run(self.ticks[start:stop], self.texts[start:stop], self.ids[start:stop],
                            self.index[start:stop] if has else None, self.values[start:stop] if has else None))
            start = stop
        self.first += upto
        del self.ticks[:upto], self.texts[:upto], self.ids[:upto]
        self.found, self.index, self.values = self.found[upto:], self.index[upto:], self.values[upto:]
        return runs
