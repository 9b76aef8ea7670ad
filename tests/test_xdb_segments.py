"""Sealed segments: the storage pass moves the hot timesteps into Parquet files that read as before; a
deleted session's text leaves them (and experience.duckdb) by rewriting only the segments holding it,
while recording goes on; compression's deletions wait until half a segment is deleted; a moved data
dir, a crash's leftovers, a backup and an older file all read what they hold."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_audit_erasure import WORD, files_holding
from xdb_recording import recording, say

from core.config import XDBConfig
from xdb import XDB, RemoteXDB
from xdb.backup_erase import erase_from_backup
from xdb.owner import EVERY
from xdb.schema import EXPERIENCE_FILE, MIGRATIONS, migrate
from xdb.storage import segments


def rows(xdb: XDB | RemoteXDB, session: str) -> list[dict[str, Any]]:
    return xdb.recall(session_id=session, limit=1000, owner=EVERY)


@pytest.mark.process
def test_sealed_rows_read_as_before_and_a_deletion_leaves_every_file(tmp_path: Path) -> None:
    data = tmp_path / "x"
    with RemoteXDB(data, XDBConfig(segment_rows=5)) as xdb:
        say(xdb, "victim", WORD, 4)
        say(xdb, "keeper", "kept", 4)
        xdb.writer.flush(10)
        before = rows(xdb, "victim")
        report = xdb.compact()["segments"]
        assert report["sealed"]["rows"] == 8 and report["hot_rows"] == 0 and report["segments"] == 1
        assert rows(xdb, "victim") == before  # read back from the segment, every column
        assert files_holding(data / "segments", WORD.encode()) != []
        xdb.delete_session("victim")
        assert rows(xdb, "victim") == []  # listed as deleted at once
        assert files_holding(data / "segments", WORD.encode()) != []  # the file waits for the erase pass
        with recording(xdb, "keeper") as sent:
            result = xdb.vacuum()
        xdb.writer.flush(10)
        assert result["segments"]["rewritten"] == 1 and result["held_s"] <= result["seconds"]
        assert files_holding(data, WORD.encode()) == []
        assert [r["tick"] for r in rows(xdb, "keeper")] == list(range(4 + sent[0]))  # no row lost
        assert xdb.verify_audit().ok
    with RemoteXDB(data) as xdb:
        assert len(rows(xdb, "keeper")) == 4 + sent[0]


def test_compression_deletes_wait_until_half_a_segment_is_deleted(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(segment_rows=1)) as xdb:
        for session in ("a", "b", "c", "d"):
            say(xdb, session, "text", 2)
        xdb.writer.flush(10)
        assert xdb._segment_pass()["sealed"]["rows"] == 8
        with xdb.cursor() as cur:
            assert segments.delete_rows(cur, "a", "t.session_id = ?", ["a"], erase=False) == 2
        report = xdb._segment_pass()
        assert report["rewritten"] == 0 and report["segment_deleted_rows"] == 2 and report["segment_rows"] == 8
        assert rows(xdb, "a") == [] and len(rows(xdb, "b")) == 2
        with xdb.cursor() as cur:
            assert segments.delete_rows(cur, "b", "t.session_id = ?", ["b"], erase=False) == 2
        report = xdb._segment_pass()
        assert report["rewritten"] == 1 and report["segment_deleted_rows"] == 0 and report["segment_rows"] == 4
        assert [len(rows(xdb, s)) for s in "abcd"] == [0, 0, 2, 2]


def test_a_moved_data_dir_reads_its_own_segments_and_leftovers_are_removed(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(segment_rows=1)) as xdb:
        say(xdb, "s", "moved", 3)
        xdb.writer.flush(10)
        xdb._segment_pass()
    shutil.copytree(tmp_path / "x", tmp_path / "y")
    shutil.rmtree(tmp_path / "x")
    leftover = tmp_path / "y" / "segments" / ".cut-short.duckdb.partial"
    leftover.write_bytes(b"a seal a crash cut short")
    with XDB.open(tmp_path / "y") as xdb:
        assert [r["content"] for r in rows(xdb, "s")] == ["moved0", "moved1", "moved2"]
    assert not leftover.exists()
    with XDB.open(tmp_path / "y", read_only=True) as xdb:  # `ahc xdb recall` on a stopped server's dir
        assert [r["content"] for r in rows(xdb, "s")] == ["moved0", "moved1", "moved2"]


def test_a_backup_holds_the_segments_and_an_erasure_there_leaves_the_live_files(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(segment_rows=1)) as xdb:
        say(xdb, "victim", WORD, 3)
        say(xdb, "keeper", "kept", 3)
        xdb.writer.flush(10)
        xdb._segment_pass()
        xdb.backup(tmp_path / "b")
    assert files_holding(tmp_path / "b" / "segments", WORD.encode()) != []
    assert erase_from_backup(tmp_path / "b", "victim")
    assert files_holding(tmp_path / "b", WORD.encode()) == []
    assert files_holding(tmp_path / "x" / "segments", WORD.encode()) != []  # a rewrite, not an edit of a link
    with XDB.open(tmp_path / "b") as copy:
        assert rows(copy, "victim") == [] and len(rows(copy, "keeper")) == 3


def test_a_file_of_the_previous_schema_keeps_its_timesteps(tmp_path: Path) -> None:
    data = tmp_path / "x"
    data.mkdir()
    conn = duckdb.connect(str(data / EXPERIENCE_FILE))
    migrate(conn, data / EXPERIENCE_FILE, [m for m in MIGRATIONS if m[0] < 8], "xdb_meta", "ahc-xdb")  # before segments
    conn.execute("INSERT INTO timesteps (id, session_id, tick, event_type, content, created_at) "
                 "VALUES (0, 's', 0, 'input', 'from before', now()::TIMESTAMP)")
    conn.execute("INSERT INTO session_ticks VALUES ('s', 0)")
    conn.execute("INSERT OR REPLACE INTO xdb_meta VALUES ('last_timestep_id', '0')")
    conn.close()
    with XDB.open(data) as xdb:
        assert [r["content"] for r in rows(xdb, "s")] == ["from before"]
        say(xdb, "s", "after", 1)
        xdb.writer.flush(10)
        assert [r["tick"] for r in rows(xdb, "s")] == [0, 1]


def test_adjacent_small_segments_merge_into_one_and_reads_go_on(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(segment_rows=2)) as xdb:
        reports = []
        for n in range(segments.MERGE_FAN):
            say(xdb, f"s{n}", "merged", 2)
            xdb.writer.flush(10)
            reports.append(xdb._segment_pass())
        assert [r["merged"] for r in reports] == [0] * (segments.MERGE_FAN - 1) + [segments.MERGE_FAN]
        assert reports[-1]["segments"] == 1 and reports[-1]["segment_rows"] == 2 * segments.MERGE_FAN
        assert [len(rows(xdb, f"s{n}")) for n in range(segments.MERGE_FAN)] == [2] * segments.MERGE_FAN
        assert len(list((tmp_path / "x" / "segments").iterdir())) == 1


def test_a_bounded_recall_reads_segment_by_segment_as_one_query_reads_the_view(tmp_path: Path) -> None:
    """Paged with offsets and a deleted session's rows listed: each segment read alone, then the hot table,
    finds what one query over the view finds."""
    with XDB.open(tmp_path / "x", XDBConfig(segment_rows=5)) as xdb:
        for turn in range(segments.MERGE_FAN - 1):  # as many segments as stay unmerged
            for session in ("a", "b", "gone"):
                say(xdb, session, f"t{turn}-", 3)
            xdb.writer.flush(10)
            xdb._segment_pass()
        say(xdb, "a", "hot-", 2)
        xdb.writer.flush(10)
        with xdb.cursor() as cur:
            segments.delete_rows(cur, "gone", "t.session_id = ?", ["gone"], erase=False)
        assert len(segments.windows(xdb.conn.cursor())) >= 2
        for filters in ({}, {"session_id": "a"}, {"text": "t2-"}, {"offset": 4, "limit": 5}):
            whole = [r["id"] for r in rows_of(xdb.recall(filters, owner=EVERY))]
            paged = [r["id"] for r in rows_of(xdb.recall_page(filters, owner=EVERY)["data"])]
            assert paged == whole and whole, filters


def rows_of(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert not any(r["session_id"] == "gone" for r in found)
    return found
