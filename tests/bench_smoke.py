"""Every registered benchmark's smoke run: the small load it runs at (its one environment variable) and
the figures and ratios its JSON line must name. Shared by tests/test_bench_smoke.py and by the tests
that already run a bench end to end, so that no bench runs twice in `make test`."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass, field
from typing import Any

import forked

from server.cluster.server_process import AHC


@dataclass(frozen=True)
class Smoke:
    """The environment that makes the bench's load small, the keys its result must have, and figures
    whose values the small load sets (so a load that never reached the bench fails)."""

    figures: frozenset[str]
    ratios: frozenset[str]
    env: dict[str, str] = field(default_factory=dict)
    loaded: dict[str, int] = field(default_factory=dict)


def smoke(figures: str, ratios: str, loaded: dict[str, int] | None = None, **env: str) -> Smoke:
    return Smoke(frozenset(figures.split()), frozenset(ratios.split()), env, loaded or {})


SMOKES: dict[str, Smoke] = {
    "universe": smoke("numpy_cells_per_s numba_cells_per_s", "numba_over_numpy", {"grids": 16, "steps": 8},
                      BENCH_UNIVERSE_LOAD="smoke"),
    "xdb": smoke("writer_rows_per_s raw_duckdb_rows_per_s recall_p95_ms recall_partial_queries rows restart_open_s "
                 "restart_full_verify_s bytes_per_token audit_bytes_share erase_s erase_commit_wait_p99_ms "
                 "history_erase_s history_commit_wait_p99_ms history_bytes_per_row history_restart_s",
                 "writer_over_raw history_commit_wait_over_idle",
                 {"rows": 100_000, "restart_records": 120_000, "storage_tokens": 20_000, "history_rows": 200_000},
                 BENCH_XDB_LOAD="smoke"),
    "orchestrator": smoke("hit_ratio naive_hit_ratio ttft_p50_ms naive_ttft_p50_ms assembly_p99_ms",
                          "ttft_naive_over_ours", {"turns": 2},
                          BENCH_ORCHESTRATOR_LOAD="smoke"),
    "activations": smoke("decode_tok_per_s_capture decode_tok_per_s_plain", "capture_over_plain",
                         {"batch": 2, "max_tokens": 16, "rounds": 1},
                         BENCH_ACTIVATIONS_LOAD="smoke"),
    "serve": smoke("ahc_tok_per_s vllm_tok_per_s ahc_cpu_us_per_token vllm_cpu_us_per_token ahc_itl_p99_ms "
                   "vllm_itl_p99_ms", "ahc_over_vllm", {"batch": 2, "max_tokens": 16, "rounds": 1},
                   BENCH_SERVE_LOAD="smoke"),
    "retrieval": smoke("sync_chunks_per_s embed_chunks_per_s search_p50_ms search_p95_ms db_and_fusion_p50_ms",
                       "sync_over_embed db_and_fusion_share_of_search", {"queries": 5},
                       BENCH_RETRIEVAL_LOAD="smoke"),
    "agents": smoke("ahc_hit_ratio fcfs_hit_ratio hit_ratio_ceiling ahc_tok_per_s fcfs_tok_per_s ahc_preemptions "
                    "ahc_wait_p99_ms ahc_jct_mean_s fcfs_jct_p99_s", "ahc_hit_over_ceiling ahc_tok_over_fcfs "
                    "fcfs_jct_over_ahc", {"sessions": 4, "turns": 3},
                    BENCH_AGENTS_LOAD="smoke"),
    # Measured in-process on tests/test_cluster.py's own cluster, at that test's load.
    "cluster": smoke("single_hit_ratio affinity_hit_ratio round_robin_hit_ratio failover_first_token_s",
                     "affinity_over_single round_robin_over_affinity round_robin_prefill_over_affinity"),
    "long-session": smoke("ahc_prefill_tokens client_prefill_tokens ahc_hit_ratio client_hit_ratio mode_switches "
                          "compactions", "client_prefill_over_ahc", {"turns": 12},
                          BENCH_LONG_SESSION_LOAD="smoke"),
    "quality": smoke("accuracy_none accuracy_cag accuracy_rag accuracy_condensed prompt_tokens_none cached_tokens_none "
                     "prompt_tokens_cag cached_tokens_cag prompt_tokens_rag cached_tokens_rag prompt_tokens_condensed "
                     "cached_tokens_condensed", "codex_condensed_over_full", {"questions": 3, "documents": 1},
                     BENCH_QUALITY_LOAD="smoke"),
}


def run_bench(name: str, timeout_s: int = 600, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`ahc bench NAME --json` at the bench's small load (`env` over it): its last stdout line, checked."""
    # A session of its own, so that a bench cut off takes the servers it started with it.
    try:
        done = forked.run([AHC, "bench", name, "--json"], timeout_s, env={**SMOKES[name].env, **(env or {})})
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"`ahc bench {name}` gave no result in {timeout_s} s:\n{str(expired.stderr)[-4000:]}"
                             ) from None
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    check_result(name, result)
    figures = result["figures"]
    assert {k: figures.get(k) for k in SMOKES[name].loaded} == SMOKES[name].loaded, f"{name}: not at its small load"
    return result


def check_result(name: str, result: dict[str, Any]) -> None:
    """The result names the bench, has every key of its smoke entry, and every figure and ratio is a
    finite number (a NaN or a string in a bench's JSON is a silent break)."""
    assert result["bench"] == name
    figures, ratios = result["figures"], result["ratios"]
    expected = SMOKES[name]
    assert expected.figures <= figures.keys(), f"{name}: no figures {sorted(expected.figures - figures.keys())}"
    assert expected.ratios <= ratios.keys(), f"{name}: no ratios {sorted(expected.ratios - ratios.keys())}"
    bad = {k: v for k, v in {**figures, **ratios}.items() if not isinstance(v, int | float) or not math.isfinite(v)}
    assert not bad, f"{name}: not finite numbers: {bad}"
