"""AHC's series, fed directly: what is counted apart and under which labels."""

from __future__ import annotations


def test_hidden_calls_and_cache_breaks_are_counted_apart() -> None:
    from orchestrator.blocks import Block
    from orchestrator.cache_report import CacheReport
    from server.metrics import AHCMetrics
    from server.model.hidden_calls import HIDDEN_REQUEST_PREFIX

    metrics = AHCMetrics(model_name="m")
    metrics.record_request("chatcmpl-1", 100, 90)
    metrics.record_request(f"{HIDDEN_REQUEST_PREFIX}x", 50, 0)
    metrics.record_request(None, 10, 0)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"model_name": "m", **labels})

    assert value("ahc_prompt_tokens_total", kind="agent") == 110
    assert value("ahc_cached_prompt_tokens_total", kind="agent") == 90
    assert value("ahc_prompt_tokens_total", kind="hidden") == 50

    blocks = (Block("identity", "i", 12, "a"), Block("state", "s", 300, "b"), Block("query", "q", 5, "c"))
    metrics.record_context(CacheReport("cag", blocks, "p", None))  # a session's first request breaks nothing
    metrics.record_context(CacheReport("cag", blocks, "p", "state", ["vram_queue", "compaction"]))
    metrics.record_context(CacheReport("cag", blocks, "p", "state"))
    assert value("ahc_cache_breaks_total", first_changed_block="state") == 2
    assert value("ahc_cache_breaks_total", first_changed_block="identity") is None
    assert value("ahc_context_block_tokens_count", block="state") == 3
    assert value("ahc_context_block_tokens_sum", block="state") == 900
    assert value("ahc_governor_actions_total", action="vram_queue") == 1
    assert value("ahc_compactions_total") == 1


def test_gpu_memory_is_read_from_the_engines_own_gpus(monkeypatch) -> None:
    """NVML numbers GPUs physically; the engine's may be any of them (CUDA_VISIBLE_DEVICES)."""
    import types

    from server.admission.kv_geometry import KVGeometry, device_memory

    asked: list[int] = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: asked.append(i) or i,
        nvmlDeviceGetMemoryInfo=lambda i: types.SimpleNamespace(used=(i + 1) * 10.0, total=100.0))
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    geometry = KVGeometry(layers=2, kv_heads=1, head_dim=64, dtype_bytes=2, block_size=16, num_blocks=8,
                          on_gpu=True, devices=(3, 5))
    memory = device_memory(0.5, geometry)
    assert asked == [3, 5]
    assert (memory.used_bytes, memory.total_bytes) == (40.0 + 60.0, 200.0)


def test_docs_list_every_series_and_no_other() -> None:
    import re
    from pathlib import Path

    from server.metrics import AHCMetrics

    documented = set(re.findall(r"`(ahc_[a-z_]+)`", (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()))
    registry = AHCMetrics(model_name="m").registry
    exposed = {family.name + ("_total" if family.type == "counter" else "") for family in registry.collect()}
    assert exposed == documented
