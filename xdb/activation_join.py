"""Generated tokens joined to their concept activations in the writer, not in the API process.

The engine's worker sends each step's activations over the side channel (lens/side_channel.py) straight
to the process that writes XDB; the API process sends each token with its request key and output
position (`TokenBatch.activation_key`, `first_position`) and never touches an activation. At GPU token
rates that keeps the receiving, matching and stacking of every token's rows off the event loop that
streams the replies.

The writer's prepare stage joins the batches it takes: a batch whose activations have not all come
waits for them until its `join_by` (set when the writer accepted it: the configured wait later), woken
as messages arrive; then its rows are written, with the activations that came and NULL for the rest,
never invented ones. Activations normally come first (the worker ships every 20 ms, the recorder cuts
token chunks every 32 steps), so the wait is for a reply's last few tokens at most. Batches are written
in order, so a wait holds the batches behind it too: it ends as soon as the missing rows provably will
not come (every sender's messages cover the time the batch was made, lens/side_channel.py), or the
receiver has died, and a batch whose activations were lost holds the others for one message, not for
its whole deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from lens.inbox import ActivationInbox, Row
from lens.side_channel import ActivationReceiver
from xdb.rows import TimestepRow, TokenBatch

log = logging.getLogger("ahc.xdb")

Part = list[TimestepRow] | TokenBatch


class ActivationJoiner:
    def __init__(self, address: str, k: int, wait_s: float) -> None:
        """Bind the side channel at `address`; rows past `k` concepts are cut (the store holds k)."""
        self.k = k
        self.wait_s = wait_s
        self.inbox = ActivationInbox()
        self.receiver = ActivationReceiver(address, self.inbox.put, self.inbox.evict_stale)

    def join(self, parts: list[Part]) -> list[Part]:
        """The parts with every keyed TokenBatch replaced by its runs, activations filled in."""
        joined: list[Part] = []
        for part in parts:
            if isinstance(part, TokenBatch) and part.activation_key is not None:
                joined += self._join(part)
            else:
                joined.append(part)
        return joined

    def _join(self, batch: TokenBatch) -> list[TokenBatch]:
        key, first = batch.activation_key, batch.first_position
        assert key is not None
        rows: list[Row | None] = [None] * len(batch)
        missing = list(range(len(batch)))
        while True:
            seen = self.inbox.deliveries  # before the look: a delivery after it still wakes the wait
            for i, row in zip(missing, self.inbox.take(key, [first + i for i in missing])):
                rows[i] = row
            missing = [i for i in missing if rows[i] is None]
            left = (batch.join_by or 0.0) - time.monotonic()
            if not missing or left <= 0 or self._not_coming(batch):
                break
            self.receiver.wake()
            self.inbox.wait(seen, left)
        return runs(batch, rows, self.k, self.inbox.source, self.inbox.hidden_k)

    def _not_coming(self, batch: TokenBatch) -> bool:
        """The rows still missing will never come: nothing receives them, or every sender has shipped
        all it took up to when the batch was made (after its tokens' steps)."""
        if not self.receiver.alive:
            return True
        return batch.created_at is not None and self.inbox.covered(float(np.max(batch.created_at)))

    def close(self) -> None:
        self.receiver.close()


def runs(batch: TokenBatch, rows: Sequence[Row | None], k: int, source: str | None,
         hidden_k: int = 0) -> list[TokenBatch]:
    """The batch cut into runs of consecutive rows that all have activations or all lack them. A row's last
    `hidden_k` slots are hidden concepts' (`batch.hidden_names`): the run's hidden activations, which only
    the audit log stores."""
    out: list[TokenBatch] = []
    start = 0
    while start < len(rows):
        has = rows[start] is not None
        stop = start + 1
        while stop < len(rows) and (rows[stop] is not None) == has:
            stop += 1
        run = batch.slice(start, stop)
        run.activation_key = None
        if has:
            taken = [r for r in rows[start:stop] if r is not None]
            if hidden_k:
                secret = _arrays([(i[len(i) - hidden_k:], v[len(v) - hidden_k:]) for i, v in taken], hidden_k)
                taken = [(i[:len(i) - hidden_k], v[:len(v) - hidden_k]) for i, v in taken]
                if secret[0].size and int(secret[0].max()) >= len(batch.hidden_names):
                    log.error("hidden activations of %s index past the pack's %d hidden concepts: not audited",
                              batch.activation_key, len(batch.hidden_names))
                else:
                    run.hidden_index, run.hidden_values = secret
            index, values = _arrays(taken, k)
            if index.size and int(index.max()) >= len(batch.concept_names):
                log.error("activations of %s index past the pack's %d concepts: stored without them",
                          batch.activation_key, len(batch.concept_names))
            else:
                run.concept_index, run.concept_values, run.activation_source = index, values, source
        out.append(run)
        start = stop
    return out


def _arrays(rows: list[Row], k: int) -> tuple[np.ndarray, np.ndarray]:
    if all(len(r[0]) == k for r in rows):  # the usual case: every row has k concepts
        # np.array of equal rows stacks them at a third of np.stack's cost (its checks are Python).
        return np.array([r[0] for r in rows], dtype=np.int32), np.array([r[1] for r in rows], dtype=np.float32)
    index = np.full((len(rows), k), -1, dtype=np.int32)
    values = np.zeros((len(rows), k), dtype=np.float32)
    for i, (idx, val) in enumerate(rows):
        index[i, :min(len(idx), k)], values[i, :min(len(val), k)] = idx[:k], val[:k]
    return index, values
