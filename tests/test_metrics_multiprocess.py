"""AHC's series with several API server processes: prometheus_client's multiprocess mode, as vLLM runs it for
`--api-server-count`, merged by the `MultiProcessCollector` that vLLM's `/metrics` serves.

The API processes are real, spawned interpreters that import prometheus_client with
`PROMETHEUS_MULTIPROC_DIR` set; this one imported it in single-process mode, so it only reads their files.
Nothing here imports prometheus_client or the server at module level: the spawned children import this
module to find their target before they may set the mode up.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from server.metrics import AHCMetrics

XDB_FILE = "experience.duckdb"
XDB_FILE_BYTES = 123


@dataclass(frozen=True)
class Plan:
    """What one API process sees."""
    prompt: int
    cached: int
    kv_usage: float
    queue: float  # livesum
    head: float  # max
    receiving: float  # livemax
    sessions: float  # livemin
    storage_pass: bool  # only one process runs the storage pass (xdb_quota_ratio: mostrecent)


PLANS = {
    "a": Plan(prompt=100, cached=50, kv_usage=0.25, queue=3, head=9, receiving=1, sessions=-1, storage_pass=True),
    "b": Plan(prompt=300, cached=250, kv_usage=0.5, queue=4, head=5, receiving=0, sessions=3, storage_pass=False),
}


def feed(metrics: AHCMetrics, plan: Plan, data_dir: Path) -> None:
    """The same calls the server makes, with `plan`'s figures."""
    from server.admission.kv_geometry import KVGeometry
    from server.model.hidden_calls import HIDDEN_REQUEST_PREFIX

    metrics.record_request("chatcmpl-1", plan.prompt, plan.cached)
    metrics.record_request(f"{HIDDEN_REQUEST_PREFIX}x", 10, 0)
    metrics.one(metrics.compactions).inc()
    metrics.one(metrics.session_wait_seconds).observe(0.2)
    metrics.record_kv_usage(plan.kv_usage, KVGeometry(layers=2, kv_heads=1, head_dim=64, dtype_bytes=2,
                                                      block_size=16, num_blocks=8, on_gpu=False))
    metrics.computed(metrics.one(metrics.xdb_queue_depth), lambda: plan.queue)
    metrics.computed(metrics.one(metrics.audit_head_seq), lambda: plan.head)
    metrics.computed(metrics.one(metrics.lens_receiver_up), lambda: plan.receiving)
    metrics.computed(metrics.one(metrics.session_cache_sessions), lambda: plan.sessions)
    metrics.computed(metrics.one(metrics.kv_events_undecodable), lambda: 0.0)
    metrics.watch_xdb_files(data_dir, [Path(XDB_FILE)])
    metrics.one(metrics.chat_template_prefix_stable).set(1)
    if plan.storage_pass:
        metrics.record_storage_pass({"quota_bytes": 100, "usage_bytes": 40})


def api_process(path: str, role: str, data_dir: str) -> None:
    """One API process: its AHCMetrics fed as `role`, its computed gauges refreshed."""
    import asyncio
    import os

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path  # before prometheus_client's import (inherited as well)
    from prometheus_client import CollectorRegistry

    from server.metrics import AHCMetrics

    metrics = AHCMetrics(model_name="m")
    assert metrics.multiprocess_dir == path
    target = CollectorRegistry()
    assert metrics.attach(target) is None and list(target.collect()) == []  # the files carry everything
    if role == "idle":  # a server just started
        metrics.refresh()
        return
    feed(metrics, PLANS[role], Path(data_dir))
    if role == "a":
        metrics.refresh()
        return
    # A function that fails is skipped, and the loop goes on refreshing the others.
    calls: list[float] = []

    def queue() -> float:
        calls.append(PLANS[role].queue)
        return calls[-1]

    def broken() -> float:
        raise OSError("the XDB service is gone")

    metrics.computed(metrics.one(metrics.kv_events_undecodable), broken)
    metrics.computed(metrics.one(metrics.xdb_queue_depth), queue)

    async def run_a_while() -> None:
        task = asyncio.create_task(metrics.refresh_forever(0.01))
        await asyncio.sleep(0.2)
        assert not task.done()
        task.cancel()

    asyncio.run(run_a_while())
    assert len(calls) >= 3, calls


def run(path: Path, role: str, data_dir: Path, monkeypatch: Any) -> int:
    ctx = multiprocessing.get_context("spawn")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(path))  # the child's environment from its start
    process = ctx.Process(target=api_process, args=(str(path), role, str(data_dir)))
    process.start()
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    process.join(60)
    assert process.exitcode == 0, f"API process {role} failed (its traceback is in the captured stderr)"
    assert process.pid is not None
    return process.pid


def scrape(path: Path) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """AHC's samples as vLLM's multiprocess `/metrics` serves them, each asserted to appear once."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))  # what vllm.v1.metrics.prometheus serves in this mode
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    families = [f for f in text_string_to_metric_families(generate_latest(registry).decode())
                if f.name.startswith("ahc_")]
    assert len({f.name for f in families}) == len(families)
    for family in families:
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"{key} appears twice"
            assert "pid" not in sample.labels, key
            samples[key] = sample.value
    return samples


@pytest.mark.process
def test_one_view_across_api_processes(tmp_path: Path, monkeypatch: Any) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from server.metrics import AHCMetrics, mark_dead

    files, data_dir = tmp_path / "prom", tmp_path / "data"
    files.mkdir()
    data_dir.mkdir()
    (data_dir / XDB_FILE).write_bytes(b"x" * XDB_FILE_BYTES)
    pid_a = run(files, "a", data_dir, monkeypatch)
    pid_b = run(files, "b", data_dir, monkeypatch)
    merged = scrape(files)

    def value(name: str, **labels: str) -> float:
        return merged[(name, frozenset({"model_name": "m", **labels}.items()))]

    # Counters and histograms: summed.
    assert value("ahc_prompt_tokens_total", kind="agent") == 400
    assert value("ahc_cached_prompt_tokens_total", kind="agent") == 300
    assert value("ahc_prompt_tokens_total", kind="hidden") == 20
    assert value("ahc_compactions_total") == 2
    assert value("ahc_session_wait_seconds_count") == 2
    assert value("ahc_session_wait_seconds_bucket", le="0.25") == 2
    # The hit ratio over both processes' requests (b's own would be 250/300), computed by the last refresh.
    assert value("ahc_prefix_cache_hit_ratio") == 300 / 400
    # mostrecent: the newest stats any process got; the engine-wide file and disk readings.
    assert value("ahc_kv_cache_usage_ratio") == 0.5
    geometry_bytes = value("ahc_vram_total_bytes")
    assert geometry_bytes > 0 and value("ahc_vram_used_bytes") == 0.5 * geometry_bytes
    assert value("ahc_xdb_bytes", file=XDB_FILE) == XDB_FILE_BYTES
    assert value("ahc_data_disk_bytes", state="total") > 0
    assert value("ahc_chat_template_prefix_stable") == 1
    # Set by a's storage pass only: b's zero (shown from the start) does not outdo it.
    assert value("ahc_xdb_quota_ratio") == 0.4
    assert value("ahc_xdb_vacuum_due") == 0
    # livesum, max, livemax, livemin.
    assert value("ahc_xdb_queue_depth") == 3 + 4
    assert value("ahc_audit_head_seq") == 9
    assert value("ahc_lens_receiver_up") == 1
    assert value("ahc_session_cache_sessions") == -1
    assert value("ahc_kv_events_undecodable") == 0  # b's broken function wrote nothing
    assert value("ahc_prefill_seconds_per_token") == 0

    # The same series as one process serves (bar the `_created` samples multiprocess mode has none of).
    single = AHCMetrics(model_name="m")
    feed(single, PLANS["a"], data_dir)
    single_keys = {(s.name, frozenset(s.labels.items()))
                   for f in text_string_to_metric_families(generate_latest(single.registry).decode())
                   for s in f.samples if not s.name.endswith("_created")}
    assert set(merged) == single_keys

    # A dead process's live gauges go; its counters, and the non-live gauges, stay.
    mark_dead(pid_a, str(files))
    after = scrape(files)
    key = ("ahc_xdb_queue_depth", frozenset({"model_name": "m"}.items()))
    assert after[key] == 4
    assert after[("ahc_lens_receiver_up", key[1])] == 0
    assert after[("ahc_session_cache_sessions", key[1])] == 3
    assert after[("ahc_prompt_tokens_total", frozenset({"model_name": "m", "kind": "agent"}.items()))] == 400
    assert after[("ahc_audit_head_seq", key[1])] == 9
    assert pid_b != pid_a


@pytest.mark.process
def test_a_fresh_process_shows_what_one_process_shows(tmp_path: Path, monkeypatch: Any) -> None:
    """Every series a scrape shows from the start in one process shows in multiprocess mode too, at zero
    ("mostrecent" gauges included, which the merge leaves out until set)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from server.metrics import AHCMetrics

    run(tmp_path, "idle", tmp_path, monkeypatch)
    merged = scrape(tmp_path)
    single = {(s.name, frozenset(s.labels.items())): s.value
              for f in text_string_to_metric_families(generate_latest(AHCMetrics(model_name="m").registry).decode())
              for s in f.samples if not s.name.endswith("_created")}
    assert merged == single


def test_one_process_reads_computed_series_when_scraped(tmp_path: Path) -> None:
    """Without multiprocess mode `computed` is `set_function`, `refresh` has nothing to do, and `mark_dead`
    has no files to touch."""
    import asyncio

    from server.metrics import AHCMetrics, mark_dead

    metrics = AHCMetrics(model_name="m")
    assert metrics.multiprocess_dir is None
    depth = [2.0]
    metrics.computed(metrics.one(metrics.xdb_queue_depth), lambda: depth[0])
    metrics.refresh()
    asyncio.run(asyncio.wait_for(metrics.refresh_forever(0.01), 1))  # returns at once
    depth[0] = 5.0
    assert metrics.registry.get_sample_value("ahc_xdb_queue_depth", {"model_name": "m"}) == 5.0
    mark_dead(12345)
