"""A full or failing disk under XDB's data dir (xdb.on_disk_full): `pause` holds every row and, past
max_queue_rows, answers a 503 that names the disk, with /health degraded and the recording gauge paused;
`spill` sends the rows to files in spill_dir and serves on, and sends them in order once the disk mends,
or at the next start after a kill. Nothing is lost or stored twice. The disk fills the way
tests/test_xdb_service.py fills it: a row whose unpickling makes the service's inserts fail with ENOSPC
while a marker file exists."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from test_xdb_service import FullDisk

from core.config import XDBConfig
from server.admission.recording_gate import RecordingGate
from server.recording.record_queue import RecordQueue
from xdb import RemoteXDB, TimestepRow
from xdb.owner import EVERY
from xdb.service import remote as remote_module
from xdb.service.spill import Spill

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_module, "DISK_RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(remote_module, "DISK_RETRY_MAX_S", 0.4)


def until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def row(xdb: RemoteXDB, session: str, text: str, **metadata: Any) -> list[TimestepRow]:
    return [TimestepRow(session, xdb.next_ticks(session, 1)[0], "input", "user", text, metadata=metadata or None)]


def fill_disk(xdb: RemoteXDB, marker: Path, *sessions: str) -> None:
    """The disk is full from the next row on: recording pauses. `sessions` are new ones, known before (a new
    session's first tick is looked up in the service, which the fault keeps stopping)."""
    for session in ("trigger", *sessions):
        xdb.start_session(session)
    marker.touch()
    xdb.writer.submit(row(xdb, "trigger", "first", a=FullDisk(marker)))
    until(lambda: xdb.writer.recording_state()[0] == "paused")


def contents(xdb: RemoteXDB, session: str) -> list[str]:
    return [r["content"] for r in xdb.recall(session_id=session, owner=EVERY, limit=10_000)]


def spill_files(spill: Path) -> list[Path]:
    return sorted(spill.rglob("*.spill"))


def test_spill_dir_is_required_and_outside_the_data_dir(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="spill_dir"):
        XDBConfig(on_disk_full="spill")
    inside = XDBConfig(on_disk_full="spill", spill_dir=str(tmp_path / "x" / "spill"))
    with pytest.raises(ValueError, match="inside the data dir"):
        RemoteXDB(tmp_path / "x", inside)


@pytest.mark.process
def test_pause_answers_a_503_naming_the_disk_and_loses_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                               ) -> None:
    from server.api_process import watch_xdb
    from server.app import install_health_route
    from server.metrics import AHCMetrics

    caplog.set_level(logging.INFO, logger="ahc.xdb")
    marker, data = tmp_path / "disk-full", tmp_path / "x"
    with RemoteXDB(data, XDBConfig(max_queue_rows=5)) as xdb:
        fill_disk(xdb, marker, "s")
        writer = xdb.writer
        metrics = AHCMetrics(model_name="m")
        watch_xdb(cast(Any, SimpleNamespace(data_dir=str(data))), cast(Any, xdb), metrics)
        paused = {s.labels["state"]: s.value for m in metrics.xdb_recording.collect() for s in m.samples}
        assert paused == {"recording": 0.0, "paused": 1.0, "stopped": 0.0}

        async def engine_ok() -> None:
            return None

        app = FastAPI()
        install_health_route(app, cast(Any, SimpleNamespace(recorder=writer, engine=SimpleNamespace(
            check_health=engine_ok))))
        health = TestClient(app).get("/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert str(data) in health.json()["reason"]

        async def overflow() -> tuple[JSONResponse, RecordQueue]:
            queue = RecordQueue(writer, writer.max_queue_rows)
            for i in range(12):  # 4 more fit in the writer (5 rows), then 6 wait here: over the backlog of 5
                queue.submit(row(xdb, "s", f"r{i}"))
            recorder = SimpleNamespace(alive=writer.alive, queue=queue, recording_state=writer.recording_state)
            gate = RecordingGate(cast(Any, recorder), 0.1, 7)
            scope = {"type": "http", "method": "POST", "path": "/v1/completions"}
            refused = await gate(cast(Any, scope), Headers())
            assert isinstance(refused, JSONResponse)
            return refused, queue

        async def scenario() -> None:
            try:
                refused, queue = await overflow()
                time.sleep(1.5)  # retried several times meanwhile: still paused, never stopped
                assert writer.recording_state()[0] == "paused" and writer.alive
            finally:
                marker.unlink(missing_ok=True)  # the disk has room again
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "7"
            message = bytes(refused.body).decode()
            assert "disk" in message and str(data) in message and "free space" in message, message
            await asyncio.wait_for(queue.drained(), 60)

        asyncio.run(scenario())
        writer.flush(60)
        assert writer.recording_state() == ("recording", None)
        assert contents(xdb, "s") == [f"r{i}" for i in range(12)]
        assert contents(xdb, "trigger") == ["first"]
    records = [r for r in caplog.records if r.name == "ahc.xdb"]
    assert [r.levelno for r in records if "paused:" in r.getMessage()] == [logging.ERROR]
    assert [r.levelno for r in records if "resumed" in r.getMessage()] == [logging.INFO]


@pytest.mark.process
def test_spill_serves_on_and_stores_every_row_once_in_order(tmp_path: Path) -> None:
    marker, spill = tmp_path / "disk-full", tmp_path / "spill"
    config = XDBConfig(max_queue_rows=20, on_disk_full="spill", spill_dir=str(spill))
    with RemoteXDB(tmp_path / "x", config) as xdb:
        try:
            fill_disk(xdb, marker, "s")
            for i in range(200):  # ten times the bound: it never waits past a spill, let alone refuses
                xdb.writer.submit(row(xdb, "s", f"r{i}"), timeout=5)
            until(lambda: len(spill_files(spill)) > 0)
            files = spill_files(spill)
            assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
            assert (spill / "owner").stat().st_mode & 0o777 == 0o700
            state, why = xdb.writer.recording_state()
            assert state == "paused" and "spilled" in (why or "")
        finally:
            marker.unlink(missing_ok=True)
        for i in range(200, 210):  # after the disk mends, behind the spilled rows
            xdb.writer.submit(row(xdb, "s", f"r{i}"), timeout=5)
        xdb.writer.flush(60)
        assert xdb.writer.recording_state() == ("recording", None)
        assert contents(xdb, "s") == [f"r{i}" for i in range(210)]
        assert contents(xdb, "trigger") == ["first"]
        until(lambda: not spill_files(spill), 10)  # removed once committed


@pytest.mark.process
def test_a_stop_while_the_disk_fails_leaves_every_row_spilled_for_the_next_start(tmp_path: Path) -> None:
    marker, spill, data = tmp_path / "disk-full", tmp_path / "spill", tmp_path / "x"
    config = XDBConfig(on_disk_full="spill", spill_dir=str(spill))
    try:
        xdb = RemoteXDB(data, config)
        fill_disk(xdb, marker, "s")
        for i in range(30):
            xdb.writer.submit(row(xdb, "s", f"r{i}"), timeout=5)
        started = time.monotonic()
        xdb.close()  # no waiting for the disk: the rows held in memory join the spilled ones
        assert time.monotonic() - started < 30 and spill_files(spill)
    finally:
        marker.unlink(missing_ok=True)
    with RemoteXDB(data, config) as xdb:
        assert xdb.writer.rows_written == 31
        assert contents(xdb, "trigger") == ["first"]  # held in memory when it stopped: spilled first
        assert contents(xdb, "s") == [f"r{i}" for i in range(30)]
        until(lambda: not spill_files(spill), 10)


@pytest.mark.process
def test_a_failing_spill_dir_falls_back_to_pause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Spill, parts: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(Spill, "append", broken)
    marker = tmp_path / "disk-full"
    config = XDBConfig(max_queue_rows=5, on_disk_full="spill", spill_dir=str(tmp_path / "spill"))
    with RemoteXDB(tmp_path / "x", config) as xdb:
        try:
            fill_disk(xdb, marker, "s", "t")
            accepted = [xdb.writer.try_submit(row(xdb, "s", f"r{i}")) for i in range(4)]
            until(lambda: "spill dir failed" in (xdb.writer.recording_state()[1] or ""))
            assert accepted == [True] * 4
            assert not xdb.writer.try_submit(row(xdb, "t", "over"))  # held in memory: bounded, as in pause
        finally:
            marker.unlink(missing_ok=True)
        xdb.writer.flush(60)
        assert contents(xdb, "s") == [f"r{i}" for i in range(4)]


@pytest.mark.process
def test_an_attached_writer_spills_to_a_directory_of_its_own(tmp_path: Path) -> None:
    marker, spill = tmp_path / "disk-full", tmp_path / "spill"
    config = XDBConfig(max_queue_rows=20, on_disk_full="spill", spill_dir=str(spill))
    with RemoteXDB(tmp_path / "x", config) as owner:
        with RemoteXDB(tmp_path / "x", config, attach=owner.service_spec) as attached:
            try:
                fill_disk(attached, marker, "a")
                for i in range(100):
                    attached.writer.submit(row(attached, "a", f"a{i}"), timeout=5)
                until(lambda: bool(spill_files(spill)))
                assert all(f.parent.name.startswith("stream-") for f in spill_files(spill))
            finally:
                marker.unlink(missing_ok=True)
            attached.writer.flush(60)
            assert contents(attached, "a") == [f"a{i}" for i in range(100)]
        assert [d.name for d in spill.iterdir()] == ["owner"]  # the attached one's went with its close


KILLED_WHILE_SPILLING = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_xdb_service import FullDisk
from core.config import XDBConfig
from xdb import RemoteXDB, TimestepRow
from xdb.service import remote
remote.DISK_RETRY_FIRST_S = remote.DISK_RETRY_MAX_S = 1000.0  # paused: no service runs meanwhile
marker = Path({marker!r})
marker.touch()
xdb = RemoteXDB({data!r}, XDBConfig(on_disk_full="spill", spill_dir={spill!r}))
xdb.start_session("trigger")
xdb.start_session("s")
xdb.writer.submit([TimestepRow("trigger", 0, "input", "user", "first", metadata={{"a": FullDisk(marker)}})])
while xdb.writer.recording_state()[0] != "paused":
    time.sleep(0.02)
for i in range(50):
    xdb.writer.submit([TimestepRow("s", i, "input", "user", f"r{{i}}")])
while xdb.writer._spiller is None or xdb.writer._spiller.spill.unread_rows < 50:  # written and fsynced
    time.sleep(0.02)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.process
def test_rows_spilled_by_a_killed_server_are_sent_at_the_next_start(tmp_path: Path) -> None:
    marker, spill, data = tmp_path / "disk-full", tmp_path / "spill", tmp_path / "x"
    script = KILLED_WHILE_SPILLING.format(tests=str(TESTS), marker=str(marker), data=str(data), spill=str(spill))
    done = subprocess.run([sys.executable, "-c", script], timeout=120, cwd=TESTS.parent,
                          env={**os.environ, "PYTHONPATH": str(TESTS.parent)})
    assert done.returncode == -signal.SIGKILL
    assert spill_files(spill)
    marker.unlink()  # the next start finds the disk with room
    kept = {path: path.read_bytes() for path in spill_files(spill)}
    config = XDBConfig(on_disk_full="spill", spill_dir=str(spill))
    with RemoteXDB(data, config) as xdb:
        # Sent before the constructor returned, so new rows take ticks after them.
        assert xdb.writer.rows_written == 50
        until(lambda: not spill_files(spill), 10)  # removed once committed
        assert contents(xdb, "s") == [f"r{i}" for i in range(50)]
        xdb.writer.submit(row(xdb, "s", "after"))
        xdb.writer.flush(30)
        assert contents(xdb, "s")[-1] == "after"
    with RemoteXDB(data, config) as xdb:  # a second start finds nothing more to send
        assert xdb.writer.rows_written == 0
    for path, data_bytes in kept.items():  # a kill after the commit, before the files went: sent again...
        path.write_bytes(data_bytes)
    with RemoteXDB(data, config) as xdb:
        assert xdb.writer.rows_written == 50
        assert contents(xdb, "s") == [f"r{i}" for i in range(50)] + ["after"]  # ...and skipped, as stored


def test_a_segment_cut_short_by_a_crash_reads_back_up_to_its_last_whole_record(tmp_path: Path) -> None:
    spill = Spill(tmp_path / "spill", "owner")
    first = [TimestepRow("s", 0, "input", "user", "a"), TimestepRow("s", 1, "input", "user", "b")]
    spill.append([first])
    spill.append([[TimestepRow("s", 2, "input", "user", "c")]])
    spill.prepend([[TimestepRow("s", -1, "input", "user", "older")]])
    spill.close()
    newest = spill_files(tmp_path / "spill")[-1]
    newest.write_bytes(newest.read_bytes()[:-3])  # the last record's end never reached the disk
    again = Spill(tmp_path / "spill", "owner")
    assert again.adopt_leftovers() == 3
    texts = []
    while (taken := again.take()) is not None:
        texts += [r.content for part in taken[1] for r in cast(list[TimestepRow], part)]
    assert texts == ["older", "a", "b"]
