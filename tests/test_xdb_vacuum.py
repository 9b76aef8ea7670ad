"""A live vacuum: the XDB service rewrites the experience file whole while rows keep coming, so a deleted
session's text leaves every file under the data dir and no row is lost; the storage loop runs it once a
deletion is due; an XDB in the server's own process refuses with a clear error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_audit_erasure import WORD, files_holding
from xdb_recording import recording, say

from core.config import XDBConfig
from core.errors import Conflict
from server.recording.quota_loop import enforce_quota_forever
from xdb import XDB, RemoteXDB, verify_audit
from xdb.owner import EVERY


@pytest.mark.process
def test_a_live_vacuum_removes_a_deleted_sessions_text_and_loses_no_row(tmp_path: Path) -> None:
    data = tmp_path / "x"
    with RemoteXDB(data) as xdb:
        say(xdb, "victim", WORD)
        say(xdb, "keeper", "kept")
        xdb.writer.flush(10)
        assert xdb.compact()["vacuum_due"] is False
        xdb.delete_session("victim")
        assert xdb.compact()["vacuum_due"] is True
        with recording(xdb, "keeper", 0.001) as sent:
            result = xdb.vacuum()
        assert result["bytes_after"] > 0 and result["seconds"] >= 0
        xdb.writer.flush(10)
        assert xdb.compact()["vacuum_due"] is False
        assert sent[0] > 0 and xdb.committed_tick("keeper") == sent[0] + 2  # ticks 0.. all committed
        assert len(xdb.recall(session_id="keeper", tick_from=sent[0] + 3 - 50, limit=1000, owner=EVERY)) == 50
        assert files_holding(data, WORD.encode()) == []
        assert xdb.verify_audit().ok
    assert verify_audit(data).ok


@pytest.mark.process
def test_the_storage_loop_vacuums_once_a_deletion_is_due(tmp_path: Path) -> None:
    reports: list[dict] = []  # type: ignore[type-arg]

    async def run(xdb: RemoteXDB) -> None:
        def heard(report: dict) -> None:  # type: ignore[type-arg]
            reports.append(report)
            if len(reports) == 3:
                raise asyncio.CancelledError

        await enforce_quota_forever(xdb, 0.05, lambda text: "gist", heard, erase_within_s=3600.0)

    with RemoteXDB(tmp_path / "x") as xdb:
        say(xdb, "victim", WORD)
        xdb.writer.flush(10)
        xdb.delete_session("victim")
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(run(xdb))
    assert "vacuum" in reports[0] and not any("vacuum" in r for r in reports[1:])
    assert [r["vacuum_due"] for r in reports] == [True, False, False]
    assert files_holding(tmp_path / "x", WORD.encode()) == []


def test_an_in_process_xdb_refuses_a_live_vacuum(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb, pytest.raises(Conflict, match="ahc xdb vacuum"):
        xdb.vacuum()


@pytest.mark.process
def test_a_file_over_the_bound_is_not_vacuumed_live(tmp_path: Path) -> None:
    """Recording waits while a vacuum copies the file: past xdb.vacuum_max_bytes the service refuses, naming
    the offline command, and goes on serving."""
    with RemoteXDB(tmp_path / "x", XDBConfig(vacuum_max_bytes=4096)) as xdb:
        say(xdb, "s", "kept")
        xdb.writer.flush(10)
        with pytest.raises(Conflict, match="over xdb.vacuum_max_bytes.*ahc xdb vacuum --data-dir"):
            xdb.vacuum()
        say(xdb, "s", "more")
        xdb.writer.flush(10)
        assert xdb.committed_tick("s") == 5
