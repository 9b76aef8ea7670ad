"""AHC's Prometheus metrics, served on vLLM's own `/metrics` next to vLLM's.

Prompt and cached-token counts come from a vLLM stat logger, so every request the engine finishes is
counted (streamed or not, ours or a hidden orchestrator call) from the engine's own numbers.

With several API server processes over one engine (vLLM's `--api-server-count`), prometheus_client runs in
multiprocess mode (`PROMETHEUS_MULTIPROC_DIR` set before it was imported): every process writes its values
to mmap files in that folder, and vLLM's `/metrics` serves what its `MultiProcessCollector` merges from all
of them. Counters and histograms are summed there; each gauge is merged by its `multiprocess_mode`, chosen
below for what it measures. A gauge computed when scraped (`set_function`) would never reach the files, so
such gauges are declared with `AHCMetrics.computed` and written by `AHCMetrics.refresh`, which the server
runs every few seconds (`refresh_forever`).
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, values
from prometheus_client.metrics import MetricWrapperBase

from orchestrator.cache_report import CacheReport
from server.admission.host_load_cost import HostLoadCost
from server.admission.kv_geometry import DeviceMemory, KVGeometry, device_memory
from server.admission.prefill_cost import PrefillCost
from server.admission.vram_governor import KVStats
from server.model.hidden_calls import HIDDEN_REQUEST_PREFIX

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import PerEngineStatLoggerFactory
    from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)

log = logging.getLogger("ahc.metrics")

# Block sizes run from a one-line Identity to a Codex of a million tokens.
BLOCK_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)


class AHCMetrics:
    """Every `ahc_*` series, each labelled with the served `model_name` as vLLM labels its own. Series
    vLLM already has (KV usage, its prefix-cache counters, latencies) are not repeated; a ratio is left to
    the dashboard's `rate()`, not kept as a lifetime gauge. A metric nobody feeds stays at zero (or, when
    labelled, reports no series) rather than an invented value."""

    def __init__(self, kv_stats: KVStats | None = None, model_name: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        # Multiprocess mode is fixed when prometheus_client is imported (its value class), as it is for vLLM.
        self.multiprocess_dir = multiprocess_dir()
        self._computed: dict[Gauge, _Computed] = {}
        self._merged: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        r, m = self.registry, ["model_name"]
        # `kind`: agent (what clients asked) or hidden (the server's own calls: compaction summaries), so a
        # summary's cold prompt does not pull the agents' hit rate down.
        self.prompt_tokens = Counter("ahc_prompt_tokens", "Prompt tokens of finished requests", m + ["kind"],
                                     registry=r)
        self.cached_prompt_tokens = Counter(
            "ahc_cached_prompt_tokens", "Prompt tokens of finished requests served from the prefix cache",
            m + ["kind"], registry=r)
        # How each gauge merges across API server processes (multiprocess mode; ignored otherwise):
        # "mostrecent" for an engine-wide value the processes read alike (the newest reading wins, and a dead
        # process's last one is outdone by the next live refresh), "livesum" for a per-process part of a
        # total, and the "live" max and min where the worst live view is what to see (`mark_dead` drops a
        # dead process's).
        self.vram_used_bytes = Gauge(
            "ahc_vram_used_bytes", "Memory in use on the engine's GPUs (on the CPU: KV cache host bytes in use)", m,
            registry=r, multiprocess_mode="mostrecent")
        self.vram_total_bytes = Gauge(
            "ahc_vram_total_bytes", "Memory of the engine's GPUs (on the CPU: KV cache host bytes)", m, registry=r,
            multiprocess_mode="mostrecent")
        # Kept for dashboards and checks written against them; rate() over the counters above (and vLLM's
        # vllm:kv_cache_usage_perc) are the better views. The ratio is read when scraped, the usage set from
        # each engine step's stats.
        self.prefix_cache_hit_ratio = Gauge(
            "ahc_prefix_cache_hit_ratio",
            "Agents' cached / prompt tokens since start-up (ahc_cached_prompt_tokens_total{kind=\"agent\"} / "
            "ahc_prompt_tokens_total{kind=\"agent\"})", m, registry=r, multiprocess_mode="mostrecent")
        # The engine sends each step's stats to one API process only: the newest, whichever got it, is the
        # engine's (vLLM merges vllm:kv_cache_usage_perc the same way).
        self.kv_cache_usage_ratio = Gauge(
            "ahc_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (as vllm:kv_cache_usage_perc)", m,
            registry=r, multiprocess_mode="mostrecent")
        self.context_mode = Counter("ahc_context_mode", "Chat requests by context mode", m + ["mode"], registry=r)
        self.context_block_tokens = Histogram(
            "ahc_context_block_tokens", "Tokens in each block of an assembled prompt", m + ["block"],
            buckets=BLOCK_TOKEN_BUCKETS, registry=r)
        self.cache_breaks = Counter(
            "ahc_cache_breaks",
            "Session requests by the first prompt block that differs from the session's previous request "
            "(where the reusable cached prefix ends; 'query' means everything above the question was reused)",
            m + ["first_changed_block"], registry=r)
        self.compactions = Counter("ahc_compactions", "State compactions", m, registry=r)
        # The summary calls apart: `continued` (true: the call continued the session's cached prompt and
        # should prefill only its instruction; false: a transcript in a fresh prompt).
        self.compaction_prompt_tokens = Counter(
            "ahc_compaction_prompt_tokens", "Prompt tokens of compaction summary calls", m + ["continued"],
            registry=r)
        self.compaction_cached_tokens = Counter(
            "ahc_compaction_cached_tokens", "Prompt tokens of compaction summary calls read from the prefix cache",
            m + ["continued"], registry=r)
        self.context_mode_switches = Counter(
            "ahc_context_mode_switches",
            "Changes of a session's Codex placement (full, condensed, rag): a Codex that changed, or one that "
            "could not fit beside a compacted State", m + ["from_placement", "to_placement"], registry=r)
        self.session_wait_seconds = Histogram(
            "ahc_session_wait_seconds",
            "How long a session's turn was held back so as not to cut the cached prefix of a session in flight",
            m, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=r)
        self.governor_actions = Counter(
            "ahc_governor_actions", "Governor actions by kind (vram_reject: a 429)", m + ["action"], registry=r)
        self.xdb_rows_written = Counter("ahc_xdb_rows_written", "Rows committed to XDB", m, registry=r)
        # Each process queues its own rows: the total waiting is the sum over the live ones.
        self.xdb_queue_depth = Gauge("ahc_xdb_queue_depth", "Rows waiting in the XDB writer queue", m, registry=r,
                                     multiprocess_mode="livesum")
        self.engine_emulated = Gauge(
            "ahc_engine_emulated", "1 when the engine is emulated (every figure is modelled, no GPU ran)",
            m + ["profile"], registry=r, multiprocess_mode="max")
        # One writer can bind the side channel: up if any live process receives.
        self.lens_receiver_up = Gauge(
            "ahc_lens_receiver_up", "1 while the XDB writer receives the engine's activations (capture on)", m,
            registry=r, multiprocess_mode="livemax")
        # Each process follows the same event stream: the worst live follower is the one to see.
        self.kv_events_undecodable = Gauge(
            "ahc_kv_events_undecodable", "KV event batches from the engine that did not decode and were skipped "
            "(session admission's account is untrusted until the engine's cache is next cleared)", m, registry=r,
            multiprocess_mode="livemax")
        self.xdb_recording = Gauge(
            "ahc_xdb_recording", "1 for XDB's recording state: recording, paused (its disk failed: rows held, "
            "retrying) or stopped (nothing more is recorded; /health answers 503)", m + ["state"], registry=r,
            multiprocess_mode="mostrecent")
        self.xdb_service_restarts = Counter(
            "ahc_xdb_service_restarts", "Times the XDB service process died and was started again", m, registry=r)
        self.xdb_bytes = Gauge("ahc_xdb_bytes", "Size on disk of each XDB file", m + ["file"], registry=r,
                               multiprocess_mode="mostrecent")
        self.xdb_quota_ratio = Gauge(
            "ahc_xdb_quota_ratio", "XDB's usage (the audit log and exports included) over xdb.quota_bytes after "
            "the last storage pass (0: no quota); compression starts at xdb.compress_at", m, registry=r,
            multiprocess_mode="mostrecent")
        self.data_disk_bytes = Gauge(
            "ahc_data_disk_bytes", "The data dir's disk: its size (state=total) and what is left (state=free)",
            m + ["state"], registry=r, multiprocess_mode="mostrecent")
        self.xdb_compressed_rows = Counter(
            "ahc_xdb_compressed_rows", "Rows compressed into records of each level (reply: token rows; coarser: "
            "finer records merged)", m + ["level"], registry=r)
        self.xdb_deleted_sessions = Counter(
            "ahc_xdb_deleted_sessions", "Sessions deleted by retention (xdb.retention.delete_after_days)", m,
            registry=r)
        self.xdb_vacuum_due = Gauge(
            "ahc_xdb_vacuum_due", "1 while a deleted session's rows may still sit in a segment or the experience "
            "file's free blocks (until the next erase, within xdb.erase_within_s, or POST /v1/xdb/compact with "
            "vacuum)", m, registry=r,
            multiprocess_mode="mostrecent")
        self.xdb_vacuums = Counter(
            "ahc_xdb_vacuums", "Times the storage pass erased deleted sessions (their segments and the experience "
            "file rewritten)", m, registry=r)
        # Each process measures the engine from its own requests; the max of the live estimates is the
        # cautious one, and a process that has measured nothing yet (0) does not hide the others'.
        self.prefill_seconds_per_token = Gauge(
            "ahc_prefill_seconds_per_token", "The engine's measured seconds per computed prompt token, queueing "
            "included (0 until a long enough prefill was seen): what session-aware admission weighs a wait against",
            m, registry=r, multiprocess_mode="livemax")
        self.lake_deferred_states = Counter(
            "ahc_lake_deferred_states", "Session States stored locally while the experience lake could not take "
            "them (shipped once it is back; the reply was not failed)", m, registry=r)
        self.corrupt_session_states = Counter(
            "ahc_session_states_corrupt", "Stored session State versions skipped on load because their bytes no "
            "longer match their SHA-256 (the newest intact version was loaded instead)", m, registry=r)
        # Scraped off the machine, the head is an anchor a rewrite of the audit file cannot reach. The chain
        # only grows, so the furthest head any process has seen is the head (a lagging reading cannot pull it
        # back).
        self.audit_head_seq = Gauge(
            "ahc_audit_head_seq", "Sequence number of the audit chain's last anchored head (-1: empty)", m,
            registry=r, multiprocess_mode="max")
        self.audit_chain_verified = Gauge(
            "ahc_audit_chain_verified", "The whole audit chain's verification since the start, which runs in the "
            "background (a start verifies the log's tail): 1 intact, 0 broken, -1 still running", m, registry=r,
            multiprocess_mode="mostrecent")
        self.chat_template_prefix_stable = Gauge(
            "ahc_chat_template_prefix_stable",
            "1 if the chat template renders each prompt as a prefix of the next (checked at start-up), "
            "0 if it re-renders earlier turns (the prefix cache then breaks every turn), -1 if it cannot render "
            "the probe conversation", m, registry=r, multiprocess_mode="mostrecent")
        # Each process follows the same event stream, so the live counts agree up to lag; the min shows -1
        # while any live process's admission predicts the cache itself.
        self.session_cache_sessions = Gauge(
            "ahc_session_cache_sessions", "Sessions whose cached blocks the engine's KV events account for "
            "(what session admission reads the cache from); -1 once events were dropped and it predicts the "
            "cache itself", m, registry=r, multiprocess_mode="livemin")
        # Every series a scrape should show from the start, at zero (a labelled metric has none until used).
        for metric in (self.compactions, self.session_wait_seconds, self.xdb_rows_written, self.xdb_queue_depth,
                       self.xdb_service_restarts, self.xdb_quota_ratio, self.xdb_deleted_sessions,
                       self.xdb_vacuum_due, self.xdb_vacuums,
                       self.lake_deferred_states,
                       self.corrupt_session_states,
                       self.audit_head_seq, self.chat_template_prefix_stable, self.kv_cache_usage_ratio):
            series = self.one(metric)
            if isinstance(series, Gauge) and series._is_most_recent and self.multiprocess_dir is not None:
                # A "mostrecent" series never set has no timestamp, and the merge leaves it out: stamp the
                # zero at the epoch's first second, so it shows and any real value (stamped now) outdoes it.
                series._value.set(0.0, timestamp=1.0)
        for kind in ("agent", "hidden"):
            self.prompt_tokens.labels(model_name=model_name, kind=kind)
            self.cached_prompt_tokens.labels(model_name=model_name, kind=kind)
        self._kv_usage = 0.0
        self._geometry: KVGeometry | None = None
        self.kv_stats = kv_stats if kv_stats is not None else KVStats()  # what the VRAM governor reads
        self.prefill = PrefillCost()  # what session-aware admission weighs a wait against
        self.host_load = HostLoadCost()  # what a miss the CPU tier serves costs instead
        self._kv_usage_series = self.one(self.kv_cache_usage_ratio)  # set at each engine step's stats
        self.computed(self.one(self.prefill_seconds_per_token), lambda: self.prefill.s_per_token or 0.0)
        # Device memory is read when scraped (or refreshed), not on every engine step (NVML calls are not free).
        self.computed(self.one(self.prefix_cache_hit_ratio), self._agent_hit_ratio)
        self.computed(self.one(self.vram_used_bytes), lambda: self._device_memory().used_bytes)
        self.computed(self.one(self.vram_total_bytes), lambda: self._device_memory().total_bytes)

    def one(self, metric: _Metric) -> _Metric:
        """The metric's one series (it has no label but the model's)."""
        return metric.labels(model_name=self.model_name)

    def computed(self, series: Gauge, fn: Callable[[], float]) -> None:
        """Let `series` (a gauge's series) report `fn()`. In one process it is read when scraped
        (`set_function`). In multiprocess mode a scrape reads only the mmap files, which a `set_function`
        never writes, so `refresh` writes `fn()` there instead. A second call for the same series replaces
        the first, as `set_function` does."""
        if self.multiprocess_dir is None:
            series.set_function(fn)
        else:
            self._computed[series] = _Computed(fn)

    def refresh(self) -> None:
        """Write every computed series to the multiprocess files (nothing to do in one process: they are read
        when scraped). A series is written only when its value changed since this process last wrote it, so a
        "mostrecent" gauge shows the newest change any process saw, not whichever process refreshed last with
        an older view. A failing function is logged (once, until it succeeds again) and skipped."""
        if self.multiprocess_dir is None:
            return
        self._merged = self._read_merged()
        for series, entry in list(self._computed.items()):
            try:
                value = float(entry.fn())
            except Exception:
                if not entry.failing:
                    log.warning("%s not refreshed: its value could not be read", series, exc_info=True)
                entry.failing = True
                continue
            entry.failing = False
            if value != entry.written:
                series.set(value)
                entry.written = value

    async def refresh_forever(self, interval_s: float = 5.0) -> None:
        """`refresh` every `interval_s` until cancelled; returns at once in one process (run it as a task
        either way). The files are written on this cadence only: vLLM's multiprocess `/metrics` reads the
        files through a registry of its own, which gives no hook before a scrape."""
        if self.multiprocess_dir is None:
            return
        while True:
            try:
                self.refresh()
            except Exception:  # never stop refreshing the others for one bad read
                log.exception("metrics refresh failed")
            await asyncio.sleep(interval_s)

    def _read_merged(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """AHC's counters and "mostrecent" gauges as merged across every process's files, for the values
        that are engine-wide only once merged (the agents' hit ratio, the KV usage the latest stats gave)."""
        assert self.multiprocess_dir is not None
        files = [f for pattern in ("counter_*.db", "gauge_mostrecent_*.db")
                 for f in glob.glob(os.path.join(self.multiprocess_dir, pattern))]
        try:
            families = _merge(files, accumulate=False)
        except Exception:
            log.warning("metrics files could not be merged", exc_info=True)
            return {}
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in families if family.name.startswith("ahc_") for sample in family.samples}

    def _sample_value(self, name: str, labels: dict[str, str]) -> float | None:
        """A sample's value: this registry's in one process, all processes' merged (as of the last `refresh`)
        in multiprocess mode."""
        if self.multiprocess_dir is None:
            return self.registry.get_sample_value(name, labels)
        return self._merged.get((name, tuple(sorted(labels.items()))))

    def record_request(self, request_id: str | None, prompt_tokens: int, cached_tokens: int) -> None:
        kind = "hidden" if (request_id or "").startswith(HIDDEN_REQUEST_PREFIX) else "agent"
        self.prompt_tokens.labels(model_name=self.model_name, kind=kind).inc(prompt_tokens)
        self.cached_prompt_tokens.labels(model_name=self.model_name, kind=kind).inc(cached_tokens)

    def _agent_hit_ratio(self) -> float:
        """Over every process's requests: each process counts only its own, so in multiprocess mode the
        counters are read summed from the files (every process then computes the same ratio)."""
        labels = {"model_name": self.model_name, "kind": "agent"}
        prompt = self._sample_value("ahc_prompt_tokens_total", labels) or 0.0
        cached = self._sample_value("ahc_cached_prompt_tokens_total", labels) or 0.0
        return cached / prompt if prompt else 0.0

    def _engine_kv_usage(self) -> float:
        """The engine's KV usage: the engine gives each step's stats to one API process, so in multiprocess
        mode the newest any process got (merged from the files) rather than this process's own last."""
        if self.multiprocess_dir is None:
            return self._kv_usage
        merged = self._sample_value("ahc_kv_cache_usage_ratio", {"model_name": self.model_name})
        return self._kv_usage if merged is None else merged

    def record_kv_usage(self, usage: float, geometry: KVGeometry) -> None:
        self._kv_usage, self._geometry = usage, geometry
        self._kv_usage_series.set(usage)
        self.kv_stats.usage = usage
        self.kv_stats.total_blocks = geometry.num_blocks
        self.kv_stats.block_size = geometry.block_size
        self.kv_stats.bytes_per_block = geometry.block_size * geometry.bytes_per_token * geometry.ranks

    def watch_xdb_files(self, data_dir: Path, files: Sequence[Path]) -> None:
        """`ahc_xdb_bytes{file}`: each file's size (with its write-ahead log), and `ahc_data_disk_bytes`,
        read when scraped."""
        for state in ("total", "free"):
            self.computed(self.data_disk_bytes.labels(model_name=self.model_name, state=state),
                          partial(_disk_bytes, data_dir, state))
        for name in files:
            path = data_dir / name
            self.computed(self.xdb_bytes.labels(model_name=self.model_name, file=name.as_posix()),
                          partial(_size_with_wal, path))

    def record_storage_pass(self, report: dict[str, Any]) -> None:
        """What one storage pass (quota, retention) did: XDB.compact's report."""
        quota = report.get("quota_bytes")
        used = report["usage_bytes"] + report.get("export_bytes", 0)  # exports count against the quota too
        self.one(self.xdb_quota_ratio).set(used / quota if quota else 0.0)
        for level, rows in report.get("compressed_rows", {}).items():
            self.xdb_compressed_rows.labels(model_name=self.model_name, level=level).inc(rows)
        self.one(self.xdb_deleted_sessions).inc(len(report.get("deleted_sessions", ())))
        vacuumed = "vacuum" in report
        self.one(self.xdb_vacuums).inc(int(vacuumed))
        self.one(self.xdb_vacuum_due).set(int(bool(report.get("vacuum_due")) and not vacuumed))

    def record_context(self, report: CacheReport) -> None:
        name = self.model_name
        self.context_mode.labels(model_name=name, mode=report.mode).inc()
        for block in report.blocks:
            self.context_block_tokens.labels(model_name=name, block=block.name).observe(block.tokens)
        if report.first_changed_block is not None:
            self.cache_breaks.labels(model_name=name, first_changed_block=report.first_changed_block).inc()
        if report.switched is not None:
            self.context_mode_switches.labels(model_name=name, from_placement=report.switched[0],
                                              to_placement=report.switched[1]).inc()
        for action in report.governor:
            self.governor_actions.labels(model_name=name, action=action.split(":", 1)[0]).inc()
            if action == "compaction" or action == "vram_compact":
                self.one(self.compactions).inc()

    def record_compaction_call(self, prompt_tokens: int, cached_tokens: int, continued: bool) -> None:
        label = "true" if continued else "false"
        self.compaction_prompt_tokens.labels(model_name=self.model_name, continued=label).inc(prompt_tokens)
        self.compaction_cached_tokens.labels(model_name=self.model_name, continued=label).inc(cached_tokens)

    def _device_memory(self) -> DeviceMemory:
        if self._geometry is None:
            return DeviceMemory(0.0, 0.0)
        return device_memory(self._engine_kv_usage(), self._geometry)

    def attach(self, target: CollectorRegistry) -> _Bridge | None:
        """Expose our registry through another (vLLM's), so one `/metrics` serves both. In multiprocess mode
        nothing is attached: every `ahc_*` value is already in the files vLLM's `MultiProcessCollector`
        merges (computed ones through `refresh`), and bridging this process's registry as well would report
        each series twice, once summed and once this process's. (vLLM's `get_prometheus_registry` then
        returns a new registry at each call, not the one `/metrics` serves, so there is nothing to attach
        to either.)"""
        if self.multiprocess_dir is not None:
            return None
        bridge = _Bridge(self.registry)
        target.register(bridge)
        return bridge


@dataclass
class _Computed:
    """A computed series in multiprocess mode: its function, the value this process last wrote, and whether
    its last read failed (logged once per failing spell)."""
    fn: Callable[[], float]
    written: float | None = None
    failing: bool = False


def multiprocess_dir() -> str | None:
    """The folder of prometheus_client's multiprocess files, or None when it runs in one process. The mode
    is the one prometheus_client chose when imported (`PROMETHEUS_MULTIPROC_DIR` set then), since values
    go to the files only then."""
    if not getattr(values.ValueClass, "_multiprocess", False):
        return None
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


def mark_dead(pid: int, path: str | None = None) -> None:
    """For the supervisor of several API server processes, once process `pid` has exited: drop its "live"
    gauges (livesum, livemax, livemin) from the multiprocess files, so the rows it had queued or the
    receiver it had up stop counting. Its counters and histograms stay, as a counter may not go back.
    `path` defaults to `PROMETHEUS_MULTIPROC_DIR`; without either there are no files, and nothing to do."""
    path = path or os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")
    if path:
        _mark_process_dead(pid, path)


# prometheus_client's multiprocess helpers carry no annotations.
_merge: Callable[..., Iterable[Metric]] = multiprocess.MultiProcessCollector.merge
_mark_process_dead: Callable[[int, str], None] = multiprocess.mark_process_dead


@dataclass(eq=False)  # registries key collectors by identity
class _Bridge:
    registry: CollectorRegistry

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()

    def describe(self) -> list[Metric]:
        return []


def stat_logger_factory(metrics: AHCMetrics) -> PerEngineStatLoggerFactory:
    """A vLLM StatLoggerFactory that feeds `metrics` from the engine's per-iteration stats."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class AHCStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
            self.vllm_config = vllm_config
            self.geometry: KVGeometry | None = None

        def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
                   mm_cache_stats: MultiModalCacheStats | None = None, engine_idx: int = 0) -> None:
            if iteration_stats is not None:
                for finished in iteration_stats.finished_requests:
                    metrics.record_request(finished.request_id, finished.num_prompt_tokens,
                                           finished.num_cached_tokens)
                    metrics.prefill.observe(finished.num_prompt_tokens - finished.num_cached_tokens,
                                            finished.queued_time + finished.prefill_time)
            if scheduler_stats is not None:
                metrics.host_load.observe(scheduler_stats.kv_connector_stats)
                if self.geometry is None:
                    self.geometry = KVGeometry.from_vllm_config(self.vllm_config)
                metrics.record_kv_usage(scheduler_stats.kv_cache_usage, self.geometry)

        def log_engine_initialized(self) -> None:
            self.geometry = KVGeometry.from_vllm_config(self.vllm_config)
            metrics.record_kv_usage(0.0, self.geometry)

    return AHCStatLogger


def _size(path: Path) -> float:
    try:
        return float(path.stat().st_size)
    except FileNotFoundError:
        return 0.0


def _disk_bytes(data_dir: Path, state: str) -> float:
    usage = shutil.disk_usage(data_dir)
    return float(usage.total if state == "total" else usage.free)


def _size_with_wal(path: Path) -> float:
    return _size(path) + _size(path.with_name(path.name + ".wal"))
