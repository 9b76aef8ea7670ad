"""Backups of XDB while it is written: a consistent copy that opens as a data directory and verifies."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from cli_runner import ahc

from core.config import XDBConfig
from xdb import XDB
from xdb.audit.log import verify_audit
from xdb.owner import EVERY
from xdb.rows import TimestepRow

BACKUP_SH = str(Path(__file__).resolve().parents[1] / "scripts" / "backup.sh")


def test_a_backup_taken_under_a_steady_write_load_is_consistent(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "live", XDBConfig(max_latency_s=0.01)) as xdb:
        stop = threading.Event()

        def write() -> None:
            while not stop.is_set():
                xdb.writer.submit([TimestepRow("s", t, "output", content="y") for t in xdb.next_ticks("s", 50)])
                time.sleep(0.002)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            time.sleep(0.5)
            result = xdb.backup(tmp_path / "copy")
            time.sleep(0.2)
        finally:
            stop.set()
            writer.join()
        xdb.writer.flush()
        live_rows = xdb.conn.execute("SELECT count(*) FROM timesteps").fetchone()[0]
    assert result["audit_seq"] > 0
    assert verify_audit(tmp_path / "copy").ok
    with XDB.open(tmp_path / "copy") as copy:  # a row the snapshot missed is replayed from the audit
        count, last = copy.conn.execute("SELECT count(*), max(tick) FROM timesteps").fetchone()
    assert count == result["audit_seq"] + 1 == last + 1  # every audited row, in order, nothing else
    assert count < live_rows  # the writes went on past the snapshot


def test_a_backup_never_writes_over_something(tmp_path: Path) -> None:
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "keep.txt").write_text("mine")
    with XDB.open(tmp_path / "live") as xdb, pytest.raises(ValueError, match="not empty"):
        xdb.backup(tmp_path / "copy")
    assert (tmp_path / "copy" / "keep.txt").read_text() == "mine"


def test_the_cli_backs_up_a_stopped_servers_data(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "data") as xdb:
        xdb.writer.submit([TimestepRow("s", t, "output", content="x") for t in xdb.next_ticks("s", 10)])
    # In this process (cli_runner): the same exit codes and stderr, without three cold starts.
    done = ahc("xdb", "backup", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "copy"))
    assert done.returncode == 0, done.stderr
    assert ahc("xdb", "verify-audit", "--data-dir", str(tmp_path / "copy")).returncode == 0
    again = ahc("xdb", "backup", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "copy"))
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "not empty" in again.stderr


@pytest.mark.engine
def test_a_running_server_backs_up_on_sigusr1(server, client, model_name) -> None:
    client.chat.completions.create(model=model_name, max_tokens=8, temperature=0,
                                   messages=[{"role": "user", "content": "back me up"}],
                                   extra_body={"context": {"session_id": "backup-me"}})
    done = subprocess.run(["bash", BACKUP_SH, str(server.data_dir), str(server.process.pid)],
                          capture_output=True, text=True, timeout=320)
    assert done.returncode == 0, done.stderr
    copy = Path(done.stdout.strip())
    assert copy.parent == server.data_dir / "backups" and copy.is_dir()
    assert verify_audit(copy).ok
    with XDB.open(copy, read_only=True) as backup:
        rows = backup.recall({"session_id": "backup-me", "event_types": "output", "limit": 100}, owner=EVERY)
    assert len(rows) == 8  # the reply was durable before it completed, so it is in the copy
    assert server.process.poll() is None  # and the server serves on
