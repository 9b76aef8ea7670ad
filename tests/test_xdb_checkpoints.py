"""XDB checkpoints its files between commits, not inside the commit a reply's end waits for: DuckDB's
own threshold is raised to a ceiling, and the writer checkpoints once the WAL passes QUIET_BYTES."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import numpy as np

import xdb.checkpoints as checkpoints
from xdb import XDB, TokenBatch
from xdb.checkpoints import QuietCheckpoints
from xdb.owner import EVERY


def test_a_due_checkpoint_empties_the_wal_and_one_not_due_leaves_it(tmp_path: Path, monkeypatch) -> None:
    conn = duckdb.connect(str(tmp_path / "f.duckdb"))
    quiet = QuietCheckpoints(conn)
    assert conn.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0] == "64.0 MiB"
    conn.execute("CREATE TABLE t AS SELECT range AS a FROM range(10)")
    conn.execute("INSERT INTO t SELECT range FROM range(1000)")
    wal = quiet.wal_bytes()
    assert 0 < wal < checkpoints.QUIET_BYTES
    assert not quiet.run_if_due() and quiet.wal_bytes() == wal
    monkeypatch.setattr(checkpoints, "QUIET_BYTES", 1)
    assert quiet.run_if_due()
    assert quiet.wal_bytes() == 0
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1010


def test_the_writer_checkpoints_both_files_after_a_flush(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(checkpoints, "QUIET_BYTES", 1)
    with XDB.open(tmp_path / "x") as xdb:
        ticks = xdb.next_ticks("s", 3)
        xdb.writer.submit(TokenBatch("s", ticks, ["a", "b", "c"], token_ids=np.arange(3), request_id="r"))
        xdb.writer.flush()
        wals = [tmp_path / "x" / "experience.duckdb.wal", tmp_path / "x" / "audit" / "audit.duckdb.wal"]
        deadline = time.monotonic() + 5
        while any(w.exists() and w.stat().st_size for w in wals) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(w.exists() and w.stat().st_size for w in wals)
        assert [r["content"] for r in xdb.recall(session_id="s", owner=EVERY)] == ["a", "b", "c"]
    with XDB.open(tmp_path / "x") as xdb:
        assert [r["content"] for r in xdb.recall(session_id="s", owner=EVERY)] == ["a", "b", "c"]
        assert xdb.verify_audit().ok
