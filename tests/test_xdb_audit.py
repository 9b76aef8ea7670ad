"""The audit chain catches edits, deletions, insertions and reordering; kill -9 loses no commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from xdb import XDB, TimestepRow, verify_audit

AHC = str(Path(sys.executable).with_name("ahc"))
REPO = Path(__file__).resolve().parents[1]


def write(data_dir: Path, batches: int = 3, per_batch: int = 5) -> None:
    with XDB.open(data_dir) as xdb:
        for b in range(batches):
            ticks = xdb.next_ticks("s", per_batch)
            xdb.writer.submit([TimestepRow("s", t, "output", "assistant", f"t{t}", token_id=t, request_id=f"r{b}",
                                           concept_activations={"joy": t / 10}, steering=[{"hush": b}])
                               for t in ticks])
            xdb.writer.flush()  # one batch, one checkpoint each


def tamper(data_dir: Path, sql: str) -> None:
    con = duckdb.connect(str(data_dir / "audit" / "audit.duckdb"))
    con.execute(sql)
    con.close()


@pytest.fixture
def logged(tmp_path: Path) -> Path:
    write(tmp_path / "x")
    assert verify_audit(tmp_path / "x").ok
    return tmp_path / "x"


@pytest.mark.parametrize("sql, seq, what", [
    ("UPDATE audit_records SET content = 'forged' WHERE seq = 7", 7, "hash mismatch"),
    ("UPDATE audit_records SET concept_values = [0.99, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL]"
     " WHERE seq = 4", 4, "hash mismatch"),
    ("UPDATE audit_records SET steering = NULL WHERE seq = 11", 11, "hash mismatch"),
    ("DELETE FROM audit_records WHERE seq = 6", 6, "missing"),
    ("INSERT INTO audit_records SELECT * FROM audit_records WHERE seq = 3", 3, "twice"),
    ("UPDATE audit_records SET seq = CASE seq WHEN 8 THEN 9 ELSE 8 END WHERE seq IN (8, 9)", 8, "hash mismatch"),
])
def test_tampering_is_found_and_named(logged: Path, sql: str, seq: int, what: str) -> None:
    tamper(logged, sql)
    report = verify_audit(logged)
    assert not report.ok
    assert f"seq={seq}" in report.first_bad and what in report.first_bad


def test_truncated_tail_and_edited_concepts_are_found(logged: Path, tmp_path: Path) -> None:
    tamper(logged, "DELETE FROM audit_records WHERE seq >= 13")
    assert "missing" in verify_audit(logged).first_bad
    other = tmp_path / "y"
    write(other)
    tamper(other, "UPDATE audit_concepts SET name = 'fear'")
    assert "concept" in verify_audit(other).first_bad


def test_range_verification_reads_from_the_nearest_checkpoint(logged: Path) -> None:
    tamper(logged, "UPDATE audit_records SET content = 'forged' WHERE seq = 1")
    report = verify_audit(logged, seq_from=10, seq_to=14)
    assert report.ok and report.records_checked == 5  # only the last batch's segment was read
    assert not verify_audit(logged).ok


def test_cli_verify_audit_exit_codes(logged: Path) -> None:
    ok = subprocess.run([AHC, "xdb", "verify-audit", "--data-dir", str(logged)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    tamper(logged, "UPDATE audit_records SET tick = 99 WHERE seq = 2")
    bad = subprocess.run([AHC, "xdb", "verify-audit", "--data-dir", str(logged)], capture_output=True, text=True)
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "seq=2" in lines[0]


def test_cli_recall_prints_json_lines(logged: Path) -> None:
    out = subprocess.run([AHC, "xdb", "recall", "--data-dir", str(logged), "--tick-from", "3", "--tick-to", "4"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    import json
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["tick"] for r in rows] == [3, 4] and rows[0]["concept_activations"] == {"joy": pytest.approx(0.3)}
    bad = subprocess.run([AHC, "xdb", "recall", "--data-dir", str(logged), "--limit", "0"], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "limit" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from xdb import XDB, TimestepRow
    xdb = XDB.open({data!r})
    for b in range(3):
        xdb.writer.submit([TimestepRow("s", t, "output", content=f"t{{t}}", concept_activations={{"c": 1.0}})
                           for t in xdb.next_ticks("s", 1000)])
        xdb.writer.flush()
    print("flushed", flush=True)
    while True:  # keep writing until killed, so the kill lands mid-stream
        xdb.writer.submit([TimestepRow("s", t, "output", content="more") for t in xdb.next_ticks("s", 100)])
        time.sleep(0.001)
""")


def test_kill_9_keeps_every_committed_batch_and_the_chain(tmp_path: Path) -> None:
    data = tmp_path / "crash"
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(repo=str(REPO), data=str(data))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "flushed"
        time.sleep(0.6)  # a few more batches commit, some are in flight
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with XDB.open(data) as xdb:
        with xdb.cursor() as cur:
            count, distinct, top = cur.execute("SELECT count(*), count(DISTINCT tick), max(tick) FROM timesteps "
                                               "WHERE session_id = 's'").fetchone()
        assert count >= 3000 and count == distinct == top + 1  # every flushed row, batches whole and in order
        assert [r["tick"] for r in xdb.recall(session_id="s", tick_to=2999, limit=10_000)] == list(range(3000))
        assert xdb.verify_audit().ok
        [next_tick] = xdb.next_ticks("s", 1)
        assert next_tick == top + 1
    assert verify_audit(data).ok
