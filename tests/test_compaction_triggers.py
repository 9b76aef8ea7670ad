"""Each compressed record stores what made it: the storage loop's pass is `scheduled` (retention's aged
rows), the quota's compressions `storage_pressure` whoever runs the pass, a client's call `manual`; the
audit event of each compression carries the same label."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from core.config import RetentionConfig, XDBConfig
from server.recording.quota_loop import enforce_quota_forever
from tests.test_xdb_retention import age, audit_events, write
from xdb import XDB
from xdb.audit.log import verify_audit
from xdb.storage.compression import cold_records, usage_bytes


def triggers(xdb: XDB) -> dict[str, str | None]:
    with xdb.cursor() as cur:
        return {r["session_id"]: r["trigger"] for r in cold_records(cur)}


def one_loop_pass(xdb: XDB) -> dict[str, Any]:
    passes: list[dict[str, Any]] = []

    async def run() -> None:
        task = asyncio.create_task(enforce_quota_forever(xdb, 0.01, lambda text: text[:10], passes.append))
        while not passes:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(run())
    return passes[0]


def test_the_storage_loop_labels_retention_scheduled_and_the_quota_storage_pressure(tmp_path: Path) -> None:
    config = XDBConfig(retention=RetentionConfig(verbatim_days=30, delete_after_days=None), hot_seconds=0)
    with XDB.open(tmp_path / "x", config) as xdb:
        write(xdb, "old", 2)
        write(xdb, "busy", 6)
        age(xdb, "old", 40)
        with xdb.cursor() as cur:
            # Room for about half of busy's replies once old's are compressed: the quota takes the rest.
            xdb.quota_bytes = int(usage_bytes(cur) * 0.6 / xdb.compress_at)
        report = one_loop_pass(xdb)
        assert report["quota_pass"]["groups"] > 0
        by_session: dict[str, set[str]] = {}
        for event in audit_events(xdb, "compress_timesteps"):
            by_session.setdefault(event["session_id"], set()).add(event["trigger"])
        assert by_session == {"old": {"scheduled"}, "busy": {"storage_pressure"}}
        # Records the quota merged a level coarser (old's among them) are the pressure's.
        assert {e["trigger"] for e in audit_events(xdb, "merge_compressed_records")} <= {"storage_pressure"}
        with xdb.cursor() as cur:
            stored = {(r["level"], r["trigger"]) for r in cold_records(cur)}
        assert stored and {t for _, t in stored} <= {"scheduled", "storage_pressure"}
    assert verify_audit(tmp_path / "x").ok


def test_a_clients_compaction_is_manual_and_its_quota_pass_still_storage_pressure(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=0)) as xdb:
        write(xdb, "s", 2)
        report = xdb.compact("s", up_to_tick=9, summary="first reply", compress_released=True)
        assert report["compaction"]["trigger"] == "manual"
        assert set(triggers(xdb).values()) == {"manual"} and triggers(xdb)
        write(xdb, "t", 4)
        with xdb.cursor() as cur:
            xdb.quota_bytes = int(usage_bytes(cur) * 0.5 / xdb.compress_at)
        xdb.compact()
        assert {e["trigger"] for e in audit_events(xdb, "compress_timesteps") if e["session_id"] == "t"} == \
            {"storage_pressure"}


def test_an_unknown_trigger_is_refused_and_nothing_is_recorded(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=0)) as xdb:
        write(xdb, "s", 1)
        with pytest.raises(ValueError, match="trigger must be one of"):
            xdb.compact("s", trigger="whenever")
        with xdb.cursor() as cur:
            assert cur.execute("SELECT count(*) FROM compaction_records").fetchone()[0] == 0
            assert cold_records(cur) == []
