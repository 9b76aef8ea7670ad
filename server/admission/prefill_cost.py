"""What recomputing a prompt costs the engine, in seconds per token, as measured on the requests it
finished: the price session-aware admission weighs a wait against.

A request's time in the engine before its first token (queued behind others' prefills, then its own)
over the prompt tokens it computed: on an idle engine that is the prefill rate, on a busy one it also
counts the queue a recomputed prefix makes everyone wait in. Only prefills long enough for the
per-token work to outweigh the engine step's fixed cost are counted (a cache hit's few uncached tokens
say nothing about the rate).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_TOKENS = 256  # shorter prefills are mostly the step's fixed cost
WEIGHT = 0.2  # of the newest measurement in the running estimate


@dataclass
class PrefillCost:
    s_per_token: float | None = None  # None until a long enough prefill was measured

    def observe(self, uncached_tokens: int, prefill_s: float) -> None:
        """A finished request: the prompt tokens it computed, and the seconds from entering the engine's
        queue to its first token."""
        if uncached_tokens < MIN_TOKENS or prefill_s <= 0:
            return
        rate = prefill_s / uncached_tokens
        self.s_per_token = rate if self.s_per_token is None else WEIGHT * rate + (1 - WEIGHT) * self.s_per_token

    def s_per_block(self, block_size: int) -> float | None:
        return None if self.s_per_token is None else self.s_per_token * block_size
