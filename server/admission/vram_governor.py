"""The VRAM governor: admit a request only when the KV cache has room for what it will add.

It knows the engine's block size and block count, and reads the cache's usage from the engine's
stats each step. A request needs `ceil((prompt - cached + max_new) / block_size)` fresh blocks; the
cached part comes from the orchestrator (the blocks above the first changed one are in the cache).
Short of blocks it waits (up to a timeout), then asks for the State to be compacted, then answers
429 with Retry-After, so our own traffic never drives vLLM into preemption.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from core.errors import RateLimited


class GovernorRejected(RateLimited):
    """The KV cache cannot take the request now (429 with Retry-After), rather than preempting others."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, retry_after_s, code="kv_cache_full")


@dataclass
class KVStats:
    """Fed by the server's engine stat logger."""

    total_blocks: int = 0
    block_size: int = 16
    usage: float = 0.0
    bytes_per_block: int = 0  # of KV, over every rank; 0 until the engine reports its geometry

    @property
    def used_blocks(self) -> int:
        return math.ceil(self.usage * self.total_blocks)


class SharedReservations(Protocol):
    """The blocks every API process of the server has reserved, when there are several."""

    def publish_reserved(self, blocks: int) -> None: ...
    def others_reserved(self) -> int: ...


@dataclass
class Reservation:
    blocks: int
    _governor: VramGovernor | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._governor is not None:
            self._governor.reserve(-self.blocks)
            self._governor = None


class VramGovernor:
    def __init__(self, stats: KVStats, queue_timeout_s: float, retry_after_s: int, poll_s: float = 0.02,
                 shared: SharedReservations | None = None) -> None:
        """`shared`: the other API processes' reservations (None: this process is the only one)."""
        self.stats = stats
        self.shared = shared
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self.poll_s = poll_s
        self._reserved = 0  # admitted requests whose blocks the usage figure may not show yet
        # Requests waiting for blocks: (priority, arrival) -> blocks needed. One goes only with room left
        # for those ahead of it, so blocks are given in priority order as vLLM's own queue would.
        self._waiting: dict[tuple[float, int], int] = {}
        self._arrivals = itertools.count()

    def blocks_needed(self, prompt_tokens: int, cached_tokens: int, max_new_tokens: int, n: int = 1) -> int:
        """Fresh blocks for `n` sequences of up to `max_new_tokens` each after one prompt. The
        sequences share the prompt's full blocks, but each writes its completion after its own copy
        of the prompt's partial last block, so every sequence past the first adds that and its own
        completion."""
        size = self.stats.block_size
        fresh = max(prompt_tokens - cached_tokens, 0) + max_new_tokens
        per_extra = math.ceil((prompt_tokens % size + max_new_tokens) / size)
        return math.ceil(fresh / size) + (max(n, 1) - 1) * per_extra

    def free_blocks(self) -> int:
        if self.stats.total_blocks == 0:  # the engine has not reported yet: nothing to govern against
            return 1 << 62
        reserved = self._reserved if self.shared is None else self._reserved + self.shared.others_reserved()
        return self.stats.total_blocks - max(self.stats.used_blocks, reserved)

    def reserve(self, blocks: int) -> None:
        """Count `blocks` more (fewer, when negative) as reserved, here and for the other API processes."""
        self._reserved += blocks
        if self.shared is not None:
            self.shared.publish_reserved(self._reserved)

    def room_for(self, place: tuple[float, int]) -> int:
        """The free blocks a request at `place` may take: what those waiting ahead of it need is theirs."""
        return self.free_blocks() - sum(n for ahead, n in self._waiting.items() if ahead < place)

    async def admit(self, needed: int, shrink: Callable[[], Awaitable[int | None]] | None = None,
                    actions: list[str] | None = None, priority: int | None = None) -> Reservation:
        """Wait for `needed` blocks; `shrink` (compaction) may lower the need once before rejecting.
        `priority`: the request's engine priority (lower first; None: after every prioritised one)."""
        place = (math.inf if priority is None else float(priority), next(self._arrivals))
        self._waiting[place] = needed
        try:
            return await self._admit(place, needed, shrink, actions if actions is not None else [])
        finally:
            del self._waiting[place]

    async def _admit(self, place: tuple[float, int], needed: int,
                     shrink: Callable[[], Awaitable[int | None]] | None, actions: list[str]) -> Reservation:
        if self.stats.total_blocks and needed > self.stats.total_blocks:
            if shrink is not None and (smaller := await shrink()) is not None:
                actions.append("vram_compact")
                needed = smaller
            self._waiting[place] = needed
            if needed > self.stats.total_blocks:
                raise GovernorRejected(
                    f"the request needs {needed} KV blocks but the cache holds {self.stats.total_blocks}; "
                    "shorten the prompt or max_tokens", self.retry_after_s)
        if needed > self.room_for(place):
            actions.append("vram_queue")
            deadline = time.monotonic() + self.queue_timeout_s
            while needed > self.room_for(place) and time.monotonic() < deadline:
                await asyncio.sleep(self.poll_s)
        if needed > self.room_for(place) and shrink is not None and "vram_compact" not in actions:
            if (smaller := await shrink()) is not None:
                actions.append("vram_compact")
                needed = self._waiting[place] = smaller
        if needed > self.room_for(place):
            raise GovernorRejected(
                f"KV cache full: {needed} blocks needed, {max(self.free_blocks(), 0)} free; retry later",
                self.retry_after_s)
        self.reserve(needed)
        return Reservation(needed, self)
