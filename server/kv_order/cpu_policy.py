"""The CPU tier's eviction policy (vLLM's native offloading): the idle session expected back latest
loses its chunks first, each session's tail before its head; chunks no session claims go first, least
recently used first.

vLLM loads it by name inside the engine core (`kv_connector_extra_config`: `eviction_policy`
"ReturnOrderPolicy", `cache_policy_module_path` this module). Each request's `ReturnHint` (its
`kv_hints`) says whose chunks it stores and reuses; a chunk several sessions share (a common system
prompt) stays as long as the one expected back soonest. Everything else, including the recency that
ranks unclaimed chunks, is vLLM's LRU policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from typing_extensions import override
from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus, order_request_keys
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from server.kv_order.idle_sessions import IdleSessions, Rank
from server.kv_order.return_hint import ReturnHint


@dataclass(frozen=True)
class _Hint:
    """A request's hint, read once (ReqContext keeps per-request state by type)."""

    hint: ReturnHint | None


def hint_of(req_context: ReqContext) -> ReturnHint | None:
    parsed = req_context.get_state(_Hint)
    if parsed is None:
        parsed = _Hint(ReturnHint.read(req_context.kv_hints))
        req_context.set_state(parsed)
    return parsed.hint


class ReturnOrderPolicy(LRUCachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.sessions = IdleSessions()
        self._owners: dict[OffloadKey, set[str]] = {}
        # Each session's chunks in the order it claimed them (a prefix's head first): an ordered set.
        self._keys_of: dict[str, dict[OffloadKey, None]] = {}
        self._unclaimed: set[OffloadKey] = set()  # chunks no hinted request claimed

    def _claim(self, keys: Iterable[OffloadKey], req_context: ReqContext, start: bool) -> ReturnHint | None:
        hint = hint_of(req_context)
        if hint is None:
            return None
        if start:
            self.sessions.started(hint, req_context.req_id)
        own = self._keys_of.setdefault(hint.session, {})
        for key in keys:
            own[key] = None
            self._owners.setdefault(key, set()).add(hint.session)
            self._unclaimed.discard(key)
        return hint

    @override
    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        keys = list(keys)
        self._claim((k for k in keys if k in self.chunks), req_context, start=True)
        super().touch(keys, req_context)

    @override
    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # The chunks are inserted right after: they are the request's from the start.
        keys = list(keys)
        self._claim(keys, req_context, start=True)
        super().on_store_miss(keys, req_context)

    @override
    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]], insertion_only_keys: set[OffloadKey],
                            reused_keys: set[OffloadKey], req_context: ReqContext) -> None:
        keys = [k for k in order_request_keys(key_groups, req_context) if k in self.chunks]
        hint = self._claim(keys, req_context, start=False)
        if hint is not None:
            self.sessions.finished(hint, req_context.req_id)
        super().on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)

    @override
    def insert(self, key: OffloadKey, chunk: ChunkStatus) -> None:
        super().insert(key, chunk)
        if key not in self._owners:
            self._unclaimed.add(key)

    @override
    def remove(self, key: OffloadKey) -> None:
        super().remove(key)
        self._forget(key)

    @override
    def clear(self) -> None:
        super().clear()
        self._owners.clear()
        self._keys_of.clear()
        self._unclaimed.clear()

    def _forget(self, key: OffloadKey) -> None:
        self._unclaimed.discard(key)
        for session in self._owners.pop(key, ()):
            self._drop(session, key)

    def _drop(self, session: str, key: OffloadKey) -> None:
        own = self._keys_of.get(session)
        if own is not None:
            own.pop(key, None)
            if not own:
                del self._keys_of[session]

    @override
    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        picked = self._pick(n, protected)
        if picked is None:
            return None
        evicted = []
        for key in picked:
            chunk = self.chunks.pop(key)
            self._evictable.remove(key)
            del self._ranks[key]
            self._forget(key)
            evicted.append((key, chunk))
        self._maybe_compact_heap()
        return evicted

    def _pick(self, n: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        """`n` evictable chunks, in eviction order, or None if there are not as many (nothing changes)."""
        def free(key: OffloadKey) -> bool:
            return key in self._evictable and key not in protected

        # Chunks no hinted request claimed: least recently used first, as vLLM's LRU would.
        picked = sorted((k for k in self._unclaimed if free(k)), key=self._ranks.__getitem__)[:n]
        if len(picked) == n:
            return picked
        ranks = self.sessions.ranks(self._keys_of)
        left_to_others: list[tuple[str, OffloadKey]] = []
        for session in sorted(self._keys_of, key=ranks.__getitem__):
            mine = ranks[session]
            for key in reversed(self._keys_of[session]):  # its tail first
                if self._kept_by_another(key, session, mine, ranks):
                    left_to_others.append((session, key))
                elif free(key):
                    picked.append(key)
                    if len(picked) == n:
                        break
            if len(picked) == n:
                break
        # A shared chunk this session would lose first stays with an owner due back sooner: this session
        # lets it go (its next request claims it again), so it is not walked past on every eviction.
        for session, key in left_to_others:
            self._owners[key].discard(session)
            self._drop(session, key)
        return picked if len(picked) == n else None

    def _kept_by_another(self, key: OffloadKey, session: str, mine: Rank, ranks: dict[str, Rank]) -> bool:
        """A shared chunk goes with the owner ranked to go last (it is picked when that owner's turn comes)."""
        owners = self._owners.get(key, ())
        return len(owners) > 1 and any((ranks[o], o) > (mine, session) for o in owners if o != session)
