"""Which sessions' KV the engine keeps: the hint each request carries, the ranking of idle sessions, the
CPU tier's eviction policy (vLLM's own chunk and request types) and the scheduler's ordering of the GPU's
free blocks (vLLM's own block pool)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.kv_offload.base import OffloadKey, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from core.config import load_config
from server.kv_order.cpu_policy import ReturnOrderPolicy
from server.kv_order.idle_sessions import EXPECTED, OVERDUE, RUNNING, UNKNOWN, IdleSessions
from server.kv_order.return_hint import ReturnHint, expected_back_s
from server.kv_order.scheduler import ReturnOrderScheduler, check_vllm, return_order_scheduler
from server.kv_order.session_returns import SessionReturns

GAPS = (1.0, 2.0, 3.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_hint_travels_in_vllms_envelope_and_a_bad_one_reads_as_none() -> None:
    hint = ReturnHint("s1", GAPS)
    assert ReturnHint.read(hint.envelope("req-1")) == hint
    assert ReturnHint.read(None) is None
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    def with_payload(payload: dict[str, object], kind: str = "ahc.session_return") -> KvHintsEnvelope:
        return KvHintsEnvelope("1", "m", [KvHintAction("a", kind, "1", payload)])

    assert ReturnHint.read(with_payload({"session": 7})) is None
    assert ReturnHint.read(with_payload({"session": "s"}, kind="other")) is None
    # Gaps that are not finite non-negative numbers are dropped; the rest sorted.
    assert ReturnHint.read(with_payload({"session": "s", "gaps": [3, "x", -1, float("nan"), 1]})) == \
        ReturnHint("s", (1.0, 3.0))


def test_expected_return_is_the_mean_residual_and_none_past_every_gap() -> None:
    assert expected_back_s(GAPS, 0.0) == pytest.approx(2.0)
    assert expected_back_s(GAPS, 1.5) == pytest.approx(1.0)  # (2 + 3) / 2 - 1.5
    assert expected_back_s(GAPS, 3.0) is None
    assert expected_back_s((), 0.0) is None


def test_idle_sessions_rank_overdue_unknown_expected_latest_first_and_running_last() -> None:
    clock = Clock()
    idle = IdleSessions(clock)
    for session, gaps in (("a", GAPS), ("b", GAPS), ("new", ()), ("run", GAPS)):
        idle.started(ReturnHint(session, gaps), f"{session}-1")
    idle.finished(ReturnHint("a", GAPS), "a-1")
    clock.now = 1.0
    for session in ("b", "new"):
        idle.finished(ReturnHint(session), f"{session}-1")
    clock.now = 1.5
    ranks = idle.ranks(["a", "b", "new", "run", "gone"])
    assert [r[0] for r in (ranks["a"], ranks["b"], ranks["new"], ranks["run"])] == [EXPECTED, EXPECTED, UNKNOWN,
                                                                                    RUNNING]
    assert ranks["gone"][0] == UNKNOWN
    # a (back at 2.5) is due before b (back at 3.0): b goes first.
    assert sorted(["a", "b"], key=ranks.__getitem__) == ["b", "a"]
    clock.now = 3.5  # a is past every gap it ever left: most likely done
    assert idle.rank("a", clock.now)[0] == OVERDUE


def key(name: str) -> OffloadKey:
    return make_offload_key(name.encode().ljust(16, b"."), 0)


class Tier:
    """The policy driven as vLLM's CPU offloading manager drives it: a store miss, the insert, the
    request's end."""

    def __init__(self, capacity: int = 64) -> None:
        self.clock = Clock()
        self.policy = ReturnOrderPolicy(capacity)
        self.policy.sessions.clock = self.clock

    def context(self, session: str | None, req: str, keys: list[OffloadKey]) -> ReqContext:
        hints = ReturnHint(session, GAPS).envelope(req) if session else None
        context = ReqContext(req_id=req, kv_hints=hints)
        for position, k in enumerate(keys):
            context.set_offload_key_position(k, position)
        return context

    def store(self, session: str | None, req: str, keys: list[OffloadKey], finish: bool = True) -> None:
        context = self.context(session, req, keys)
        new = [k for k in keys if self.policy.get(k) is None]
        self.policy.on_store_miss(new, context)
        for k in new:
            chunk = ChunkStatus(len(self.policy.chunks))
            chunk.ref_cnt = 0
            self.policy.insert(k, chunk)
        if finish:
            self.policy.on_request_finished([keys], set(new), set(keys) - set(new), context)


def test_the_cpu_tier_evicts_the_session_expected_back_latest_tail_first() -> None:
    tier = Tier()
    a, b = [key(f"a{i}") for i in range(3)], [key(f"b{i}") for i in range(3)]
    tier.store("A", "a-1", a)
    tier.clock.now = 1.0
    tier.store("B", "b-1", b)
    tier.clock.now = 1.5
    # LRU would take A's (finished first); A is due back at 2.5, B at 3.0.
    assert [k for k, _ in tier.policy.evict(2, set()) or []] == [b[2], b[1]]
    tier.clock.now = 10.0  # both overdue: the least recently finished goes first
    assert [k for k, _ in tier.policy.evict(2, {a[2]}) or []] == [a[1], a[0]]


def test_unclaimed_chunks_go_first_and_a_shared_chunk_stays_with_its_soonest_owner() -> None:
    tier = Tier()
    shared = key("system")
    tier.store(None, "x-1", [key("x0")])
    tier.store("A", "a-1", [shared, key("a1")])
    tier.clock.now = 1.0
    tier.store("B", "b-1", [shared, key("b1")])
    tier.clock.now = 1.5
    order = [k for k, _ in tier.policy.evict(4, set()) or []]
    # x0 claimed by no session; B (back later) loses its own chunk, the shared one goes with A, last.
    assert order == [key("x0"), key("b1"), key("a1"), shared]


def test_a_running_sessions_chunks_go_last_and_a_short_eviction_changes_nothing() -> None:
    tier = Tier()
    tier.store("A", "a-1", [key("a0")])
    tier.store("B", "b-1", [key("b0")])
    tier.store("B", "b-2", [key("b0"), key("b1")], finish=False)  # B's next call runs
    tier.clock.now = 0.5
    assert tier.policy.evict(4, set()) is None
    assert {k for k in tier.policy.chunks} == {key("a0"), key("b0"), key("b1")}
    # A finished, overdue or not, goes before B, whose call runs; B's tail before its head.
    assert [k for k, _ in tier.policy.evict(2, set()) or []] == [key("a0"), key("b1")]
    tier.policy.remove(key("b0"))
    assert key("b0") not in tier.policy._owners and tier.policy.evict(0, set()) == []


def test_the_gpu_free_queue_is_rethreaded_by_expected_return() -> None:
    check_vllm()
    pool = BlockPool(num_gpu_blocks=9, enable_caching=True, hash_block_size=16)
    blocks = pool.blocks[1:9]  # block 0 is vLLM's null block
    for i, block in enumerate(blocks):
        block.set_block_hash(bytes([i]) * 8)  # type: ignore[arg-type]
    clock = Clock()
    scheduler = object.__new__(ReturnOrderScheduler)  # the mixin's state alone, over a real block pool
    scheduler.kv_cache_manager = SimpleNamespace(block_pool=pool)
    scheduler.idle = IdleSessions(clock)
    scheduler.in_cpu_tier = None
    scheduler._cached = {"A": [(b, b.block_hash) for b in blocks[0:3]],
                         "B": [(b, b.block_hash) for b in blocks[3:6]],
                         "C": [(blocks[7], blocks[7].block_hash)]}
    scheduler.idle.started(ReturnHint("A", GAPS), "a")
    scheduler.idle.finished(ReturnHint("A", GAPS), "a")
    clock.now = 1.0
    scheduler.idle.started(ReturnHint("B", GAPS), "b")
    scheduler.idle.finished(ReturnHint("B", GAPS), "b")
    scheduler.idle.started(ReturnHint("C", GAPS), "c")  # C runs: its blocks are in use or its own
    clock.now = 1.5
    scheduler._cached["B"].insert(0, (blocks[0], blocks[0].block_hash))  # A and B share their head
    blocks[4].ref_cnt = 1  # in use again: not free, never moved
    pool.free_block_queue.remove(blocks[4])
    scheduler.reorder()
    order = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    # Untracked free blocks and those of C (running) stay ahead; then B (back later), tail first; A, due
    # soonest, last in line, with the head it shares with B.
    assert order == [7, 8, 6, 4, 3, 2, 1]
    blocks[0].reset_hash()  # A's head was evicted and reused: no longer A's
    scheduler.reorder()
    assert [b for b, _ in scheduler._cached["A"]] == blocks[1:3]


def test_the_gpu_gives_up_blocks_the_cpu_tier_holds_first() -> None:
    """Through vLLM's own CPU offloading manager, running AHC's policy: the blocks it holds a copy of go
    first, then the others, each in return order."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from server.kv_order.scheduler import cpu_tier_lookup

    pool = BlockPool(num_gpu_blocks=7, enable_caching=True, hash_block_size=16)
    blocks = pool.blocks[1:7]
    for i, block in enumerate(blocks):
        block.set_block_hash(make_offload_key(bytes([i]) * 8, 0))  # type: ignore[arg-type]
    manager = CPUOffloadingManager(num_chunks=8, cache_policy="ReturnOrderPolicy",
                                   cache_policy_module_path="server.kv_order.cpu_policy")
    stored = [OffloadKey(blocks[i].block_hash) for i in (0, 3)]  # type: ignore[arg-type]
    context = ReqContext(req_id="r", kv_hints=ReturnHint("A", GAPS).envelope("r"))
    assert manager.prepare_store(stored, context) is not None
    manager.complete_store(stored, context)
    config = SimpleNamespace(kv_group_configs=[SimpleNamespace(hashes_per_chunk=1)])
    lookup = cpu_tier_lookup(SimpleNamespace(connector_scheduler=SimpleNamespace(manager=manager, config=config)))
    assert lookup is not None and [lookup(b.block_hash) for b in blocks] == [True, False, False, True, False, False]
    assert cpu_tier_lookup(None) is None
    clock = Clock()
    scheduler = object.__new__(ReturnOrderScheduler)
    scheduler.kv_cache_manager = SimpleNamespace(block_pool=pool)
    scheduler.idle = IdleSessions(clock)
    scheduler.in_cpu_tier = lookup
    scheduler._cached = {"A": [(b, b.block_hash) for b in blocks[0:3]], "B": [(b, b.block_hash) for b in blocks[3:6]]}
    for session, at in (("A", 0.0), ("B", 1.0)):
        clock.now = at
        scheduler.idle.started(ReturnHint(session, GAPS), session)
        scheduler.idle.finished(ReturnHint(session, GAPS), session)
    clock.now = 1.5
    scheduler.reorder()
    # The copies first (B's, back later, then A's), then what only the GPU holds, in the same order.
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [4, 1, 6, 5, 3, 2]


def test_the_scheduler_vllm_builds_matches_its_async_setting() -> None:
    built: list[type] = []

    class Probe(ReturnOrderScheduler):
        def __new__(cls, **kwargs: object) -> Probe:  # records what would be built, builds nothing
            built.append(cls)
            return object.__new__(cls)

        def __init__(self, **kwargs: object) -> None:
            pass

    config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False))
    from server.kv_order import scheduler as module

    original = module.ReturnOrderScheduler
    module.ReturnOrderScheduler = Probe  # type: ignore[misc]
    try:
        assert isinstance(return_order_scheduler(vllm_config=config), Probe)
    finally:
        module.ReturnOrderScheduler = original  # type: ignore[misc]
    assert built == [Probe]


def test_a_sessions_calls_keep_the_place_its_first_drew_and_carry_the_gaps_seen() -> None:
    clock = Clock()
    returns = SessionReturns(priority=True, hints=True, clock=clock)
    first = returns.engine_kwargs("a", "r1", 0)
    assert first["priority"] == 0 and ReturnHint.read(first["kv_hints"]) == ReturnHint("a")
    returns.engine_kwargs("b", "r2", 0)
    returns.ended("a")
    clock.now = 2.5
    again = returns.engine_kwargs("a", "r3", 0)
    assert again["priority"] == 0 and ReturnHint.read(again["kv_hints"]) == ReturnHint("a", (2.5,))
    assert returns.engine_kwargs("b", "r4", 0)["priority"] == 1
    # A client's own priority defers its call, bounded within vLLM's int64; it never moves it ahead of a
    # session that began before its own (a tenant cannot starve the others with a negative one).
    assert returns.engine_kwargs("c", "r5", 475794402)["priority"] == 2 + 475794402
    assert returns.engine_kwargs("c", "r6", 2 ** 63 - 1)["priority"] == 2 + 2 ** 40
    assert returns.engine_kwargs("d", "r7", -10 ** 9)["priority"] == 3
    assert returns.engine_kwargs("d", "r8", -10 ** 9)["priority"] > returns.engine_kwargs("a", "r9", 0)["priority"]
    off = SessionReturns(priority=False, hints=False, clock=clock)
    assert off.engine_kwargs("a", "r1", 0) == {}


def test_the_engine_is_started_with_program_order_and_return_order(tiny_model_dir: Path) -> None:
    """By default vLLM schedules by priority and its native CPU tier evicts by AHC's policy; AHC's
    scheduler class orders the GPU's free blocks on request; each is off on its own setting, and a policy
    of the command line's is kept."""
    from server.engine_args import RETURN_ORDER_POLICY, RETURN_ORDER_SCHEDULER, build_vllm_namespace, vllm_cli_args

    base = load_config("cpu-tiny").with_overrides(model=str(tiny_model_dir))
    assert "--scheduler-cls" not in vllm_cli_args(base)
    args = vllm_cli_args(base.with_overrides(**{"engine.return_order": "both"}))
    assert args[args.index("--scheduling-policy") + 1] == "priority"
    assert args[args.index("--scheduler-cls") + 1] == RETURN_ORDER_SCHEDULER
    tiered = base.with_overrides(**{"engine.kv_offloading_size": 4})
    extra = build_vllm_namespace(tiered).kv_transfer_config.kv_connector_extra_config
    assert RETURN_ORDER_POLICY.items() <= extra.items()
    own = tiered.with_overrides(**{"engine.extra_args": [
        "--kv-transfer-config", '{"kv_connector_extra_config": {"eviction_policy": "arc"}}']})
    assert build_vllm_namespace(own).kv_transfer_config.kv_connector_extra_config["eviction_policy"] == "arc"
    off = tiered.with_overrides(**{"engine.return_order": "off", "engine.session_priority": False})
    assert "--scheduler-cls" not in vllm_cli_args(off) and "--scheduling-policy" not in vllm_cli_args(off)
    transfer = build_vllm_namespace(off).kv_transfer_config
    assert transfer is None or "eviction_policy" not in transfer.kv_connector_extra_config
    gpu_only = tiered.with_overrides(**{"engine.return_order": "gpu"})
    assert "--scheduler-cls" in vllm_cli_args(gpu_only)
    transfer = build_vllm_namespace(gpu_only).kv_transfer_config
    assert transfer is None or "eviction_policy" not in transfer.kv_connector_extra_config
    with pytest.raises(ValidationError, match="return_order"):
        base.with_overrides(**{"engine.return_order": "sometimes"})
