"""The audit log bounded by retention: records whose rows retention removed leave the log after a chained
`audit_retired` event names the checkpoint they end at; what remains verifies from that anchor, names the
first bad record, says a retired range was retired by policy, and a tampered anchor or a record deleted
without a retirement is caught."""

from __future__ import annotations

import time
from pathlib import Path

import cli_runner
import pytest
from audit_files import sql

from core.config import RetentionConfig, XDBConfig
from xdb import XDB, TimestepRow, verify_audit
from xdb.audit.chain import read_heads

DAY_S = 86_400.0


def record(xdb: XDB, session: str = "s", n: int = 5, created_at: float | None = None) -> None:
    at = time.time() if created_at is None else created_at
    xdb.writer.submit([TimestepRow(session, t, "output", "assistant", f"t{t}", token_id=t, request_id=f"{session}-r",
                                   concept_activations={"joy": 0.5}, created_at=at)
                       for t in xdb.next_ticks(session, n)])
    xdb.writer.flush()  # one batch, one checkpoint



@pytest.fixture
def retired(tmp_path: Path) -> Path:
    """Three batches (checkpoints end at seq 4, 9, 14); the first two retired: event at seq 15."""
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        for _ in range(3):
            record(xdb)
        assert xdb.audit is not None
        done = xdb.audit.retire_through(9, "test")
        assert done["records"] == 10 and done["event_seq"] == 15
        record(xdb)  # 16..20
    return data


def test_what_remains_verifies_from_the_anchor(retired: Path) -> None:
    assert sql(retired, "SELECT min(seq), max(seq), count(*) FROM audit_records") == [(10, 20, 11)]
    assert sql(retired, "SELECT min(seq_end) FROM audit_checkpoints") == [(9,)]  # the anchor
    report = verify_audit(retired)
    assert report.ok, report.first_bad
    assert report.records_checked == 11
    assert report.retired is not None and report.retired.startswith("records seq=0..9 retired by policy (test)")
    assert report.erased == [report.retired]
    heads = read_heads(retired / "audit" / "audit.head")
    assert heads is not None and heads[0][0] == 9  # the head file keeps its lines from the anchor on
    result = cli_runner.ahc("xdb", "verify-audit", "--data-dir", str(retired))
    assert result.returncode == 0 and "records seq=0..9 retired by policy" in result.stdout


def test_a_retired_range_says_so(retired: Path) -> None:
    report = verify_audit(retired, 0, 5)
    assert report.ok and report.records_checked == 0 and report.retired is not None
    heads = read_heads(retired / "audit" / "audit.head")
    assert heads is not None
    assert verify_audit(retired, expect_head=heads[0]).ok  # the anchor's own head
    assert not verify_audit(retired, expect_head=(9, b"\x01" * 32)).ok
    assert verify_audit(retired, expect_head=(3, b"\x01" * 32)).ok  # retired: nothing left to compare


def test_a_tampered_record_after_the_anchor_is_named(retired: Path) -> None:
    sql(retired, "UPDATE audit_records SET tick = 99 WHERE seq = 12")
    report = verify_audit(retired)
    assert not report.ok and report.first_bad is not None
    assert report.first_bad.startswith("audit record seq=12 ") and "hash mismatch" in report.first_bad


def test_a_tampered_anchor_is_caught(retired: Path) -> None:
    sql(retired, "UPDATE audit_checkpoints SET chain_head = '\\x01'::BLOB || chain_head[2:] WHERE seq_end = 9")
    report = verify_audit(retired)
    assert not report.ok and report.first_bad is not None and report.first_bad.startswith("audit anchor at seq=9")
    with XDB.open(retired) as xdb:  # a start verifies only its tail; the whole chain (from the anchor) fails
        assert (xdb.verify_audit().first_bad or "").startswith("audit anchor at seq=9")


def test_records_deleted_without_a_retirement_are_caught(tmp_path: Path, retired: Path) -> None:
    sql(retired, "DELETE FROM audit_records WHERE seq = 10")
    report = verify_audit(retired)
    assert not report.ok and report.first_bad is not None and report.first_bad.startswith("audit record seq=10")
    data = tmp_path / "plain"
    with XDB.open(data) as xdb:
        for _ in range(3):
            record(xdb)
    sql(data, "DELETE FROM audit_records WHERE seq <= 9")  # as a retirement would, but with no event chained
    sql(data, "DELETE FROM audit_checkpoints WHERE seq_end < 9")
    report = verify_audit(data)
    assert not report.ok and report.first_bad is not None
    assert "seq" in report.first_bad and ("missing" in report.first_bad or "expected to start" in report.first_bad)


def test_a_retirement_cut_short_is_carried_out_at_the_next_open(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from xdb.audit.log import AuditLog

    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        for _ in range(3):
            record(xdb)
        monkeypatch.setattr(AuditLog, "_carry_out", lambda self, through: None)  # a crash after the event
        assert xdb.audit is not None
        xdb.audit.retire_through(4, "test")
    monkeypatch.undo()
    assert verify_audit(data).ok  # chained, not carried out: the log verifies as it stands
    with XDB.open(data):
        pass
    assert sql(data, "SELECT min(seq) FROM audit_records") == [(5,)]
    report = verify_audit(data)
    assert report.ok and report.retired is not None


def test_the_retention_pass_retires_what_it_removed_and_reports_the_share(tmp_path: Path) -> None:
    config = XDBConfig(retention=RetentionConfig(verbatim_days=30), hot_seconds=10**9, quota_bytes=10**9)
    old = time.time() - 40 * DAY_S
    with XDB.open(tmp_path / "x", config) as xdb:
        record(xdb, "old", 10, created_at=old)
        record(xdb, "old", 10, created_at=old)
        record(xdb, "new", 10)
        report = xdb.compact()
        assert report["compressed_rows"] == {"reply": 20}
        retired = report["audit_retired"]
        assert retired is not None and retired["through_seq"] == 19 and retired["reason"] == "retention"
        assert 0 < report["audit_quota_share"] < 1
        assert xdb.compact()["audit_retired"] is None  # nothing more to retire
        assert xdb.verify_audit().ok
    report = verify_audit(tmp_path / "x")
    assert report.ok, report.first_bad
    assert report.retired is not None and "retention" in report.retired
