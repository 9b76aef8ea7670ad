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
        self._keys_of: dict[str, dict[OffloadKey, int]] = {}  # session -> its chunks, by position

    def _claim(self, keys: Iterable[OffloadKey], req_context: ReqContext, start: bool) -> ReturnHint | None:
        hint = hint_of(req_context)
        if hint is None:
            return None
        if start:
            self.sessions.started(hint, req_context.req_id)
        own = self._keys_of.setdefault(hint.session, {})
        for key in keys:
            position = req_context.get_offload_key_position(key)
            own[key] = position if position is not None else own.get(key, 0)
            self._owners.setdefault(key, set()).add(hint.session)
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
    def remove(self, key: OffloadKey) -> None:
        super().remove(key)
        self._disown(key)

    @override
    def clear(self) -> None:
        super().clear()
        self._owners.clear()
        self._keys_of.clear()

    def _disown(self, key: OffloadKey) -> None:
        for session in self._owners.pop(key, ()):
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
            self._disown(key)
            evicted.append((key, chunk))
        self._maybe_compact_heap()
        return evicted

    def _pick(self, n: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        """`n` evictable chunks, in eviction order, or None if there are not as many (nothing changes)."""
        def free(key: OffloadKey) -> bool:
            return key in self._evictable and key not in protected

        # Chunks no hinted request claimed: least recently used first, as vLLM's LRU would.
        picked = sorted((k for k in self._evictable if k not in self._owners and k not in protected),
                        key=self._ranks.__getitem__)[:n]
        if len(picked) == n:
            return picked
        ranks = self.sessions.ranks(self._keys_of)
        order = sorted(self._keys_of, key=lambda s: ranks.get(s, (0, 0.0)))
        for session in order:
            mine = ranks.get(session, (0, 0.0))
            own = self._keys_of[session]
            for key in sorted(own, key=own.__getitem__, reverse=True):  # its tail first
                if free(key) and not self._kept_by_another(key, session, mine, ranks):
                    picked.append(key)
                    if len(picked) == n:
                        return picked
        return None

    def _kept_by_another(self, key: OffloadKey, session: str, mine: Rank, ranks: dict[str, Rank]) -> bool:
        """A shared chunk goes with the owner ranked to go last (it is picked when that owner's turn comes)."""
        owners = self._owners.get(key, ())
        return len(owners) > 1 and any(ranks.get(o, (0, 0.0)) > mine or (ranks.get(o, (0, 0.0)) == mine and o > session)
                                       for o in owners if o != session)
