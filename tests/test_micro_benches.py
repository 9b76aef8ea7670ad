"""The developer micro-benchmarks of the serving path run at a tiny load, so none breaks unnoticed: the
XDB writer's CPU (bench/xdb_cpu.py), the flush wait on the XDB service (bench/xdb_flush_wait.py), the
token decoder (bench/token_decode.py) and the gateway's per-chunk cost (scripts/gateway_chunk_cost.py)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from bench import xdb_cpu, xdb_flush_wait
from bench.servers import TINY_MODEL, ensure_model
from bench.token_decode import us_per_token
from xdb.service.remote_xdb import RemoteXDB

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_the_xdb_writer_bench_commits_every_token_and_fires_auto_tags() -> None:
    cpu_us, tokens, batches, tags = xdb_cpu.run(rounds=1)
    assert tokens == xdb_cpu.STREAMS * xdb_cpu.CHUNK and batches >= 1 and tags > 0 and cpu_us > 0


@pytest.mark.process
def test_the_flush_wait_bench_waits_for_every_wave(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(xdb_flush_wait, "WAVES", 2)
    monkeypatch.setattr(xdb_flush_wait, "STEPS", 1)
    with RemoteXDB(tmp_path / "xdb") as xdb:
        for s in range(3):
            xdb.start_session(f"s{s}")
        waits, rows = xdb_flush_wait.waves(xdb, 3)
        assert xdb.writer is not None and xdb.writer.rows_written == rows
    assert len(waits) == 2 and all(w > 0 for w in waits)
    assert rows == 3 * 2 * (xdb_flush_wait.CHUNK + xdb_flush_wait.CHUNK // 2 + 1)


def test_the_token_decode_bench_measures_a_reply() -> None:
    assert us_per_token(ensure_model(TINY_MODEL), rounds=1) > 0


def test_the_gateway_chunk_cost_script_streams_through_both_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("gateway_chunk_cost", SCRIPTS / "gateway_chunk_cost.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "CHUNKS", 50)
    assert asyncio.run(script.seconds(script.stream)) > 0
    assert asyncio.run(script.seconds(script.gateway(script.stream))) > 0
