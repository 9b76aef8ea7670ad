"""vLLM's scheduler, with the GPU's free blocks ordered as the CPU tier's policy orders its chunks: the
idle session expected back latest is evicted first, each session's tail before its head.

vLLM evicts cached blocks from the head of its free-block queue, least recently freed first, which for
agents cycling through a cache too small for all of them is the session due back soonest. At most every
`WALK_S` this re-threads each idle session's still-cached blocks to the queue's tail, from the session
expected back latest to the one expected back soonest, so the soonest ends last in line. Nothing is held
or pinned: allocation, preemption and the waiting queue behave as vLLM's own; a wrong prediction only
changes which free block goes first.

With vLLM's native CPU tier the GPU first gives up the blocks the tier also holds (they come back by a
copy), then the others. The tier copies every block as it is computed (it is inclusive), so with
least-recently-used order on both the two hold the larger of their sizes; giving up the copies first
makes them hold nearly their sum: the tier keeps the sessions due back soonest, the GPU what the tier
let go.

Installed with `--scheduler-cls server.kv_order.scheduler.return_order_scheduler`, which builds the
synchronous or the asynchronous scheduler as vLLM's configuration asks. It overrides three methods of
vLLM 0.32's scheduler (`add_request`, `schedule`, `_free_blocks`, the last not public): `check_vllm`
refuses to start if they or the free-block queue's methods have moved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext
from vllm.v1.request import Request

from server.kv_order.idle_sessions import OVERDUE, RUNNING, IdleSessions
from server.kv_order.return_hint import ReturnHint

log = logging.getLogger("ahc.kv_order")

WALK_S = 0.1  # the most often the free queue is re-threaded: ~100 ns a block, ~3 ms for an H100's cache
NEEDED = ((Scheduler, ("add_request", "schedule", "_free_blocks")), (KVCacheManager, ("get_blocks",)),
          (FreeKVCacheBlockQueue, ("remove", "append_n")))


def check_vllm() -> None:
    """vLLM's private methods this scheduler overrides or calls, where it expects them (vLLM 0.32)."""
    missing = [f"{owner.__name__}.{name}" for owner, names in NEEDED for name in names if not hasattr(owner, name)]
    if "free_block_queue" not in BlockPool.__init__.__code__.co_names:
        missing.append("BlockPool.free_block_queue")
    if missing:
        raise RuntimeError(f"this vLLM has no {', '.join(missing)}: AHC's return-order scheduler is written "
                           "for vLLM 0.32; set engine.return_order to \"cpu\" or \"off\"")


class ReturnOrderMixin:
    """Mixed into vLLM's Scheduler or AsyncScheduler (first in the bases)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_vllm()
        super().__init__(*args, **kwargs)
        self.idle = IdleSessions()
        # Each idle session's last request's blocks, head to tail, with the hash each had then.
        self._cached: dict[str, list[tuple[KVCacheBlock, Any]]] = {}
        self._walked_at = float("-inf")
        self.in_cpu_tier = cpu_tier_lookup(self.get_kv_connector())  # type: ignore[attr-defined]

    def add_request(self, request: Request) -> None:
        hint = ReturnHint.read(request.kv_hints)
        if hint is not None:
            self.idle.started(hint, request.request_id)
        super().add_request(request)  # type: ignore[misc]

    def _free_blocks(self, request: Request) -> None:
        hint = ReturnHint.read(request.kv_hints)
        manager: KVCacheManager = self.kv_cache_manager  # type: ignore[attr-defined]
        blocks = [b for group in manager.get_blocks(request.request_id).blocks for b in group] if hint else []
        super()._free_blocks(request)  # type: ignore[misc]
        if hint is not None:
            self._cached[hint.session] = [(b, b.block_hash) for b in blocks if b.block_hash is not None]
            self.idle.finished(hint, request.request_id)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        now = self.idle.clock()
        if self._cached and now - self._walked_at >= WALK_S:
            self._walked_at = now
            try:
                self.reorder()
            except Exception:  # the order is advisory: the engine goes on in vLLM's own
                log.exception("ordering the GPU's free blocks failed; it keeps vLLM's order from now on")
                self._cached.clear()
                self.idle = IdleSessions(self.idle.clock)
                self._walked_at = float("inf")
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def reorder(self) -> None:
        """Move every idle session's still-free cached blocks to the queue's tail, the session expected back
        latest first, each session tail first: the session due back soonest is the last to lose a block."""
        pool: BlockPool = self.kv_cache_manager.block_pool  # type: ignore[attr-defined]
        queue = pool.free_block_queue
        ranks = self.idle.ranks(self._cached)
        # By block id, in order: a block several sessions share (a common system prompt) moves with each
        # and ends where the one due back soonest puts it. Overdue sessions' blocks go first, then the
        # tier's copies, then what only the GPU holds.
        overdue: dict[int, KVCacheBlock] = {}
        copied: dict[int, KVCacheBlock] = {}
        only_here: dict[int, KVCacheBlock] = {}
        in_cpu = self.in_cpu_tier
        for session in sorted(self._cached, key=ranks.__getitem__):
            if ranks[session][0] == RUNNING:
                continue  # its blocks are in use; the next free records them anew
            still = [(b, h) for b, h in self._cached[session] if b.block_hash == h]
            if not still:
                del self._cached[session]
                continue
            self._cached[session] = still
            for block, block_hash in reversed(still):
                if block.ref_cnt == 0 and block.prev_free_block is not None:
                    group = overdue if ranks[session][0] == OVERDUE else \
                        copied if in_cpu is not None and in_cpu(block_hash) else only_here
                    for other in (overdue, copied, only_here):
                        other.pop(block.block_id, None)
                    group[block.block_id] = block
        moved = [*overdue.values(), *copied.values(), *only_here.values()]
        for block in moved:
            queue.remove(block)
        queue.append_n(moved)


def cpu_tier_lookup(connector: Any) -> Callable[[Any], bool] | None:
    """Whether vLLM's native CPU tier holds a GPU block (by its hash), or None without that tier. Its key
    for a block is the block's own hash and group when a chunk is one block (the default); other chunk
    sizes are not looked up."""
    scheduler_side = getattr(connector, "connector_scheduler", None)
    manager, config = getattr(scheduler_side, "manager", None), getattr(scheduler_side, "config", None)
    if manager is None or config is None or not hasattr(manager, "lookup"):
        return None
    if any(group.hashes_per_chunk != 1 for group in config.kv_group_configs):
        log.info("the CPU tier's chunks span several blocks: the GPU's order does not look them up")
        return None
    context = ReqContext(req_id="ahc-return-order")

    def in_cpu(block_hash: Any) -> bool:
        # A GPU block's hash with its group is the tier's key for it (make_offload_key packs the same).
        return bool(manager.lookup(OffloadKey(block_hash), context) is LookupResult.HIT)

    return in_cpu


class ReturnOrderScheduler(ReturnOrderMixin, Scheduler):
    pass


class AsyncReturnOrderScheduler(ReturnOrderMixin, AsyncScheduler):
    pass


def return_order_scheduler(**kwargs: Any) -> Scheduler:
    """The scheduler vLLM builds (it calls `--scheduler-cls` with its keyword arguments): the asynchronous
    one where its configuration schedules asynchronously."""
    async_scheduling = kwargs["vllm_config"].scheduler_config.async_scheduling
    return (AsyncReturnOrderScheduler if async_scheduling else ReturnOrderScheduler)(**kwargs)
