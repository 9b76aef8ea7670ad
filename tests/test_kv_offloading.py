"""KV offloading: `engine.kv_offloading_size` / `kv_offloading_backend` reach vLLM's engine args as
its own flags (and its flags come back into the config), and session-aware admission sizes its CPU
tier from them in the engine's blocks. The offload itself needs a GPU build's worker: the emulated
engine stands in for it (tests/test_emulation.py, tests/test_host_link.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from core.config import load_config
from server.admission.kv_geometry import KVGeometry
from server.admission.vram_governor import KVStats
from server.metrics import AHCMetrics

GIB = 1 << 30


def test_offloading_is_off_unless_a_size_is_given(tiny_model_dir: Path) -> None:
    from server.engine_args import build_vllm_namespace, vllm_cli_args

    config = load_config("cpu-tiny").with_overrides(model=str(tiny_model_dir))
    assert config.engine.kv_offloading_size is None
    assert "--kv-offloading-size" not in vllm_cli_args(config)
    assert build_vllm_namespace(config).kv_offloading_size is None


@pytest.mark.parametrize("backend", ["native", "lmcache"])
def test_the_config_becomes_vllms_engine_args(tiny_model_dir: Path, backend: str) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    from server.engine_args import build_vllm_namespace, vllm_cli_args

    config = load_config("cpu-tiny").with_overrides(**{"model": str(tiny_model_dir), "engine.kv_offloading_size": 8,
                                                       "engine.kv_offloading_backend": backend})
    args = vllm_cli_args(config)
    at = args.index("--kv-offloading-size")
    assert args[at:at + 4] == ["--kv-offloading-size", "8.0", "--kv-offloading-backend", backend]
    engine_args = AsyncEngineArgs.from_cli_args(build_vllm_namespace(config))
    assert (engine_args.kv_offloading_size, engine_args.kv_offloading_backend) == (8.0, backend)


def test_vllms_flags_come_back_into_the_config(tiny_model_dir: Path) -> None:
    from server.engine_args import with_vllm_flags

    # `ahc serve MODEL --kv-offloading-size 8`: the flag goes to vLLM, and the admission must know it.
    config = load_config("cpu-tiny").with_overrides(**{"engine.extra_args": [
        str(tiny_model_dir), "--kv-offloading-size", "8", "--kv-offloading-backend", "lmcache"]})
    synced = with_vllm_flags(config)
    assert (synced.engine.kv_offloading_size, synced.engine.kv_offloading_backend) == (8.0, "lmcache")


@pytest.mark.parametrize("field, value", [("kv_offloading_size", 0), ("kv_offloading_size", -1.0),
                                          ("kv_offloading_backend", "disk")])
def test_a_bad_offloading_setting_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        load_config("cpu-tiny").with_overrides(**{f"engine.{field}": value})


def test_gib_become_blocks_of_the_engines_geometry() -> None:
    from server.admission.session_admission import offload_blocks

    # 32 layers x 8 KV heads x 128 dims x K and V x 2 bytes = 128 KiB a token; 16-token blocks: 2 MiB.
    geometry = KVGeometry(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2, block_size=16, num_blocks=1000,
                          on_gpu=True)
    metrics = AHCMetrics(KVStats())
    metrics.record_kv_usage(0.0, geometry)
    assert metrics.kv_stats.bytes_per_block == 2 << 20
    assert offload_blocks(8, metrics.kv_stats.bytes_per_block) == 4096
    assert offload_blocks(None, metrics.kv_stats.bytes_per_block) == 0
    assert offload_blocks(8, KVStats().bytes_per_block) == 0  # before the engine reports its geometry
    # Two tensor-parallel ranks each hold half the heads; the buffer is the two ranks' together.
    split = KVGeometry(layers=32, kv_heads=4, head_dim=128, dtype_bytes=2, block_size=16, num_blocks=1000,
                       on_gpu=True, ranks=2)
    metrics.record_kv_usage(0.0, split)
    assert offload_blocks(8, metrics.kv_stats.bytes_per_block) == 4096


def test_the_admission_counts_the_configured_tier() -> None:
    from server.runtime import build_session_admission as session_admission

    config = load_config("cpu-tiny").with_overrides(**{"engine.kv_offloading_size": 0.5})
    metrics = AHCMetrics(KVStats(total_blocks=100, block_size=16, bytes_per_block=GIB // 1024))
    gate = session_admission(config, metrics)
    assert gate is not None
    assert gate.costs.offload_blocks() == 512 and gate.costs.capacity_blocks() == 100
    assert gate.costs.prefill_s_per_block() is None  # nothing measured yet: nothing held
    metrics.prefill.observe(1000, 0.5)
    assert gate.costs.prefill_s_per_block() == pytest.approx(16 * 5e-4)
    off = load_config("cpu-tiny").with_overrides(**{"orchestrator.session_admission": False})
    assert session_admission(off, metrics) is None


def test_the_engine_publishes_its_kv_events_where_admission_reads_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    from server.engine_args import build_vllm_namespace, publish_kv_events

    config = load_config("cpu-tiny").with_overrides(model=str(tiny_model_dir))
    args = build_vllm_namespace(config)
    assert publish_kv_events(args, str(tmp_path)) == f"ipc://{tmp_path}/kv-events"
    assert args.kv_events_config.enable_kv_cache_events and args.kv_events_config.publisher == "zmq"
    assert args.kv_transfer_config is None  # no tier, no connector to configure
    # With a CPU tier its events name every block, as the GPU's do.
    tiered = build_vllm_namespace(config.with_overrides(**{"engine.kv_offloading_size": 8}))
    publish_kv_events(tiered, str(tmp_path))
    assert tiered.kv_transfer_config.kv_connector_extra_config["self_describing_kv_events"] is True


@pytest.mark.parametrize("flag, endpoint", [
    ('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5599"}', "tcp://127.0.0.1:5599"),
    ('{"enable_kv_cache_events": false}', None)])
def test_a_publisher_the_command_line_sets_is_kept(tiny_model_dir: Path, tmp_path: Path, flag: str,
                                                   endpoint: str | None) -> None:
    from server.engine_args import build_vllm_namespace, publish_kv_events

    config = load_config("cpu-tiny").with_overrides(**{"model": str(tiny_model_dir),
                                                       "engine.extra_args": ["--kv-events-config", flag]})
    args = build_vllm_namespace(config)
    kept = args.kv_events_config
    assert publish_kv_events(args, str(tmp_path)) == endpoint
    assert args.kv_events_config is kept
