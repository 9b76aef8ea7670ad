"""Retention and storage governance: rows compressed past `verbatim_days`, idle sessions deleted past
`delete_after_days` (never a pinned or SUBMITTED one), compression from `compress_at` of the quota, each
deletion an audit event, and the storage metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError

from core.config import RetentionConfig, XDBConfig
from server.metrics import AHCMetrics
from xdb import XDB, TimestepRow
from xdb.audit.chain import EVENT_TYPE
from xdb.owner import EVERY
from xdb.schema import EXPERIENCE_FILE
from xdb.storage.compression import cold_records, usage_bytes
from xdb.storage.fidelity import submit_evidence
from xdb.store import AUDIT_FILE
from xdb.tags import set_bud_status


def write(xdb: XDB, session: str, replies: int, tokens: int = 10) -> None:
    for r in range(replies):
        ticks = xdb.next_ticks(session, tokens)
        xdb.writer.submit([TimestepRow(session, t, "output", "assistant", f"word{t} ", request_id=f"{session}-r{r}",
                                       concept_activations={"joy": 0.5}) for t in ticks])
    xdb.writer.flush()


def age(xdb: XDB, session: str, days: float) -> None:
    """Make a session's rows (and saved states) look `days` old."""
    for table in ("timesteps_hot", "session_states"):
        xdb.conn.execute(f"UPDATE {table} SET created_at = created_at - to_days(?::INTEGER) "
                         "- to_seconds(60) WHERE session_id = ?", [int(days), session])


def audit_events(xdb: XDB, action: str) -> list[dict]:
    assert xdb.audit is not None
    rows = xdb.audit.conn.execute("SELECT content FROM audit_records WHERE event_type = ? ORDER BY seq",
                                  [EVENT_TYPE]).fetchall()
    return [e for e in (json.loads(r[0]) for r in rows) if e["action"] == action]


def test_rows_past_verbatim_days_are_compressed_whatever_the_quota(tmp_path: Path) -> None:
    config = XDBConfig(retention=RetentionConfig(verbatim_days=30), hot_seconds=10**9)  # everything is HOT
    with XDB.open(tmp_path / "x", config) as xdb:
        write(xdb, "old", 3)
        write(xdb, "kept", 2)
        write(xdb, "new", 2)
        age(xdb, "old", 40)
        age(xdb, "kept", 40)
        xdb.pin("kept", 0, 9, "evidence")
        report = xdb.compact()
        assert report["compressed_rows"] == {"reply": 40}  # "old" and kept's unpinned second reply
        assert {r["session_id"] for r in xdb.recall({"limit": 1000}, owner=EVERY)} == {"kept", "new"}
        assert [r["tick"] for r in xdb.recall({"session_id": "kept", "limit": 100}, owner=EVERY)] == list(range(10))
        assert [c["level"] for c in xdb.read(cold_records, "old")] == ["reply"] * 3
        assert len(audit_events(xdb, "compress_timesteps")) == 4  # 3 of "old", kept's unpinned second reply


def test_idle_sessions_are_deleted_unless_pinned_or_submitted(tmp_path: Path) -> None:
    config = XDBConfig(retention=RetentionConfig(delete_after_days=7))
    with XDB.open(tmp_path / "x", config) as xdb:
        for session in ("gone", "pinned", "evidence", "active"):
            write(xdb, session, 1)
            xdb.save_session_state(session, json.dumps({"turns": []}))
        xdb.tag("insight", session_id="gone", tick=3, owner=EVERY)
        xdb.comment("note", session_id="gone", tick=2, owner=EVERY)
        for session in ("gone", "pinned", "evidence"):
            age(xdb, session, 10)
        xdb.pin("pinned", 0, 4)
        xdb.tag("bud-x", session_id="evidence", tick_range=(0, 9), tag_type="bud", owner=EVERY)
        xdb.write(set_bud_status, "bud-x", "ready", 1)
        xdb.write(submit_evidence, "bud-x", "sub-1")
        report = xdb.compact()
        assert report["deleted_sessions"] == ["gone"]
        for table in ("timesteps", "tag_applications", "comments", "session_states", "session_ticks"):
            assert xdb.conn.execute(f"SELECT count(*) FROM {table} WHERE session_id = 'gone'").fetchone() == (0,)
        assert xdb.load_session_state("gone") is None
        assert {r["session_id"] for r in xdb.recall({"limit": 1000}, owner=EVERY)} == {"pinned", "evidence", "active"}
        [event] = audit_events(xdb, "delete_session")
        assert event["session_id"] == "gone" and event["deleted"]["timesteps"] == 10
        assert event["deleted"]["tag_applications"] == 1 and event["deleted"]["comments"] == 1
        assert xdb.compact()["deleted_sessions"] == []  # nothing more to delete
    assert XDB.open(tmp_path / "x").verify_audit().ok


def test_compression_starts_at_compress_at_of_the_quota(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=0)) as xdb:
        write(xdb, "s", 10)
        xdb.compact("s")  # every row released
        used = usage_bytes(xdb.conn.cursor()) + xdb.audit_bytes()  # the audit log counts in the quota
        assert xdb.audit_bytes() > 0
        xdb.quota_bytes = int(used / 0.9)  # at 90% of the quota: under it, over compress_at
        report = xdb.compact()
        assert sum(report["compressed_rows"].values()) > 0  # the level depends on how far the audit leaves room
        assert report["usage_bytes"] <= 0.8 * xdb.quota_bytes
        xdb.compress_at = 1.0
        before = usage_bytes(xdb.conn.cursor()) + xdb.audit_bytes()  # the pass's own audit records counted
        xdb.quota_bytes = int(before / 0.9)
        assert xdb.compact()["compressed_rows"] == {}  # at 90% of the quota with compress_at 1.0


@pytest.mark.parametrize("retention", [{"verbatim_days": 0}, {"delete_after_days": -1}, {"keep": 3}])
def test_bad_retention_settings_are_refused(retention: dict) -> None:
    with pytest.raises(ValidationError):
        XDBConfig(retention=retention)


def test_storage_metrics_follow_the_files_and_each_pass(tmp_path: Path) -> None:
    metrics = AHCMetrics(model_name="m")
    with XDB.open(tmp_path / "x") as xdb:
        write(xdb, "s", 2)
        metrics.watch_xdb_files(tmp_path / "x", [Path(EXPERIENCE_FILE), AUDIT_FILE])
        metrics.record_storage_pass({"usage_bytes": 750, "quota_bytes": 1000, "compressed_rows": {"reply": 20,
                                     "session": 2}, "deleted_sessions": ["a", "b"]})
    text = generate_latest(metrics.registry).decode()
    sizes = {line.split('file="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
             for line in text.splitlines() if line.startswith("ahc_xdb_bytes{")}
    assert set(sizes) == {"experience.duckdb", "audit/audit.duckdb"} and all(v > 0 for v in sizes.values())
    assert 'ahc_xdb_quota_ratio{model_name="m"} 0.75' in text
    assert 'ahc_xdb_compressed_rows_total{level="reply",model_name="m"} 20.0' in text
    assert 'ahc_xdb_deleted_sessions_total{model_name="m"} 2.0' in text
    disk = {line.split('state="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("ahc_data_disk_bytes{")}
    assert 0 < disk["free"] <= disk["total"]  # what the alerts in deploy/alerts.yml watch


def test_the_storage_loop_applies_retention_and_reports_each_pass(tmp_path: Path) -> None:
    import asyncio

    from server.recording.quota_loop import enforce_quota_forever

    metrics = AHCMetrics(model_name="m")
    config = XDBConfig(retention=RetentionConfig(delete_after_days=1))
    with XDB.open(tmp_path / "x", config) as xdb:
        write(xdb, "idle", 1)
        age(xdb, "idle", 3)
        passes: list[dict] = []

        async def run() -> None:
            task = asyncio.create_task(enforce_quota_forever(
                xdb, 0.01, lambda text: text[:10], lambda report: (passes.append(report),
                                                                   metrics.record_storage_pass(report))))
            while not passes:
                await asyncio.sleep(0.01)
            task.cancel()

        asyncio.run(run())
        assert passes[0]["deleted_sessions"] == ["idle"] and xdb.recall({}, owner=EVERY) == []
    assert 'ahc_xdb_deleted_sessions_total{model_name="m"} 1.0' in generate_latest(metrics.registry).decode()


def test_storage_is_bounded_unless_the_config_says_forever(tmp_path: Path) -> None:
    import shutil

    config = XDBConfig()
    assert (config.retention.verbatim_days, config.retention.delete_after_days) == (30.0, 365.0)
    # No quota named: half the data dir's disk (the dir itself made later, on the disk above it).
    assert config.sized_quota(tmp_path / "not" / "yet") == shutil.disk_usage(tmp_path).total // 2
    assert XDBConfig(quota_bytes=10**9).sized_quota(tmp_path) == 10**9
    forever = XDBConfig(keep_forever=True)
    assert forever.retention.verbatim_days is None and forever.retention.delete_after_days is None
    assert forever.sized_quota(tmp_path) is None
    for contradiction in ({"quota_bytes": 10**9}, {"retention": {"verbatim_days": 7}}):
        with pytest.raises(ValidationError, match="keep_forever keeps everything"):
            XDBConfig(keep_forever=True, **contradiction)
