"""AHC's Prometheus metrics, served on vLLM's own `/metrics` next to vLLM's.

Prompt and cached-token counts come from a vLLM stat logger, so every request the engine finishes is
counted (streamed or not, ours or a hidden orchestrator call) from the engine's own numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from orchestrator.cache_report import CacheReport
from orchestrator.vram_governor import KVStats
from server.kv_geometry import DeviceMemory, KVGeometry, device_memory

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class AHCMetrics:
    """Every `ahc_*` metric. Later capabilities feed theirs; a metric nobody feeds stays at zero
    (or, when labelled, reports no series) rather than an invented value."""

    def __init__(self, kv_stats: KVStats | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.prompt_tokens = Counter("ahc_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.cached_prompt_tokens = Counter(
            "ahc_cached_prompt_tokens", "Prompt tokens served from the prefix cache", registry=r)
        self.prefix_cache_hit_ratio = Gauge(
            "ahc_prefix_cache_hit_ratio", "ahc_cached_prompt_tokens_total / ahc_prompt_tokens_total", registry=r)
        self.kv_cache_usage_ratio = Gauge("ahc_kv_cache_usage_ratio", "Fraction of KV cache blocks in use", registry=r)
        self.vram_used_bytes = Gauge(
            "ahc_vram_used_bytes", "GPU memory in use (on the CPU: KV cache host bytes in use)", registry=r)
        self.vram_total_bytes = Gauge(
            "ahc_vram_total_bytes", "GPU memory (on the CPU: KV cache host bytes)", registry=r)
        self.context_mode = Counter("ahc_context_mode", "Requests by context mode", ["mode"], registry=r)
        self.context_block_tokens = Gauge(
            "ahc_context_block_tokens", "Tokens in each block of the last assembled prompt", ["block"], registry=r)
        self.compactions = Counter("ahc_compactions", "State compactions", registry=r)
        self.governor_actions = Counter(
            "ahc_governor_actions", "Governor actions by kind", ["action"], registry=r)
        self.xdb_rows_written = Counter("ahc_xdb_rows_written", "Rows committed to XDB", registry=r)
        self.xdb_queue_depth = Gauge("ahc_xdb_queue_depth", "Rows waiting in the XDB writer queue", registry=r)
        self.xdb_service_restarts = Counter(
            "ahc_xdb_service_restarts", "Times the XDB service process died and was started again", registry=r)
        # Scraped off the machine, the head is an anchor a rewrite of the audit file cannot reach.
        self.audit_head_seq = Gauge(
            "ahc_audit_head_seq", "Sequence number of the audit chain's last anchored head (-1: empty)", registry=r)
        self.chat_template_prefix_stable = Gauge(
            "ahc_chat_template_prefix_stable",
            "1 if the chat template renders each prompt as a prefix of the next (checked at start-up), "
            "0 if it re-renders earlier turns (the prefix cache then breaks every turn), -1 if it cannot render "
            "the probe conversation", registry=r)
        self._prompt_total = 0
        self._cached_total = 0
        self._kv_usage = 0.0
        self._geometry: KVGeometry | None = None
        self.kv_stats = kv_stats if kv_stats is not None else KVStats()  # what the VRAM governor reads
        # Device memory is read when scraped, not on every engine step (NVML calls are not free).
        self.vram_used_bytes.set_function(lambda: self._device_memory().used_bytes)
        self.vram_total_bytes.set_function(lambda: self._device_memory().total_bytes)

    def record_request(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._prompt_total += prompt_tokens
        self._cached_total += cached_tokens
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_prompt_tokens.inc(cached_tokens)
        if self._prompt_total:
            self.prefix_cache_hit_ratio.set(self._cached_total / self._prompt_total)

    def record_kv_usage(self, usage: float, geometry: KVGeometry) -> None:
        self._kv_usage, self._geometry = usage, geometry
        self.kv_cache_usage_ratio.set(usage)
        self.kv_stats.usage = usage
        self.kv_stats.total_blocks = geometry.num_blocks
        self.kv_stats.block_size = geometry.block_size

    def record_context(self, report: CacheReport) -> None:
        self.context_mode.labels(mode=report.mode).inc()
        for block in report.blocks:
            self.context_block_tokens.labels(block=block.name).set(block.tokens)
        for action in report.governor:
            self.governor_actions.labels(action=action.split(":", 1)[0]).inc()
            if action == "compaction" or action == "vram_compact":
                self.compactions.inc()

    def _device_memory(self) -> DeviceMemory:
        if self._geometry is None:
            return DeviceMemory(0.0, 0.0)
        return device_memory(self._kv_usage, self._geometry)

    def attach(self, target: CollectorRegistry) -> _Bridge:
        """Expose our registry through another (vLLM's), so one `/metrics` serves both."""
        bridge = _Bridge(self.registry)
        target.register(bridge)
        return bridge


@dataclass(eq=False)  # registries key collectors by identity
class _Bridge:
    registry: CollectorRegistry

    def collect(self):
        yield from self.registry.collect()

    def describe(self):
        return []


def stat_logger_factory(metrics: AHCMetrics) -> Callable[[VllmConfig, int], object]:
    """A vLLM StatLoggerFactory that feeds `metrics` from the engine's per-iteration stats."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class AHCStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
            self.vllm_config = vllm_config
            self.geometry: KVGeometry | None = None

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            if iteration_stats is not None:
                for finished in iteration_stats.finished_requests:
                    metrics.record_request(finished.num_prompt_tokens, finished.num_cached_tokens)
            if scheduler_stats is not None:
                if self.geometry is None:
                    self.geometry = KVGeometry.from_vllm_config(self.vllm_config)
                metrics.record_kv_usage(scheduler_stats.kv_cache_usage, self.geometry)

        def log_engine_initialized(self) -> None:
            self.geometry = KVGeometry.from_vllm_config(self.vllm_config)
            metrics.record_kv_usage(0.0, self.geometry)

    return AHCStatLogger
