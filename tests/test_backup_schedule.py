"""Scheduled backups (verified, the newest N kept) and deletions that reach the backups and exports kept
under the data dir and the backup dir (xdb/storage/backups.py, server/recording/backup_loop.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from core.config import XDBConfig
from server.recording.backup_loop import BackupLoop, backup_forever
from xdb import XDB, TimestepRow, backup_erase, verify_audit
from xdb.audit.keys import KEYS_FILE
from xdb.owner import EVERY
from xdb.storage import backups
from xdb.storage.fidelity import hot_cutoff
from xdb.storage.retention import Tombstone
from xdb.storage.vacuum import vacuum_experience

WORD = "zorbleflimquaxite"  # the deleted session's text: in no file afterwards


def record(xdb: XDB, session: str, text: str, n: int = 4) -> None:
    assert xdb.writer is not None
    xdb.writer.submit([TimestepRow(session, t, "output", "assistant", f"{text}{t}", token_id=t,
                                   metadata={"note": text}) for t in xdb.next_ticks(session, n)])
    xdb.writer.flush()


def files_holding(folder: Path, needle: bytes) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes())


def sessions_in(path: Path) -> set[str]:
    with XDB.open(path, read_only=True) as copy:
        return {s for (s,) in copy.conn.execute("SELECT DISTINCT session_id FROM timesteps").fetchall()}


@pytest.mark.process
def test_the_loop_backs_up_verifies_and_keeps_the_newest(tmp_path: Path) -> None:
    data, dest = tmp_path / "data", tmp_path / "second-disk"
    reports: list[dict[str, Any]] = []
    with XDB.open(data, XDBConfig(max_latency_s=0.01)) as xdb:
        by_hand = backups.write_backup(xdb, data, dest)  # SIGUSR1's: never pruned
        loop = BackupLoop(xdb, data, dest, keep=2, on_result=reports.append)
        for i in range(3):
            record(xdb, f"s{i}", "hello")
            assert loop.once()["ok"]
    kept = backups.kept_backups(dest)
    assert [str(p) for p in kept] == [str(by_hand)] + [r["path"] for r in reports[-2:]]  # the newest two
    assert sum(len(r["removed"]) for r in reports) == 1 and loop.written == 3 and loop.failed == 0
    for path in kept:
        assert verify_audit(path).ok
    assert sessions_in(kept[-1]) == {"s0", "s1", "s2"}
    assert backups.known_dirs(data) == [data / "backups", dest.resolve()]  # noted: deletions reach it


def test_a_backup_that_fails_verification_is_logged_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    data, dest = tmp_path / "data", tmp_path / "b"
    monkeypatch.setattr(backups, "verify_backup", lambda path: (False, "audit record seq=3: forged"))
    with XDB.open(data) as xdb, caplog.at_level(logging.ERROR, "ahc.backup"):
        record(xdb, "s", "x")
        loop = BackupLoop(xdb, data, dest, keep=3)
        report = loop.once()
    assert not report["ok"] and report["error"] == "audit record seq=3: forged" and loop.failed == 1
    assert backups.kept_backups(dest) == [] and "failed verification" in caplog.text


@pytest.mark.process
def test_the_server_loop_runs_on_its_schedule(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = XDBConfig(backup_every_s=0.05, backup_keep=2, backup_dir=str(tmp_path / "b"))

    async def run(xdb: XDB) -> None:
        task = asyncio.create_task(backup_forever(xdb, data, config))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if len(list((tmp_path / "b").glob("2*"))) >= 2 and not list((tmp_path / "b").glob(".partial-*")):
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with XDB.open(data) as xdb:
        record(xdb, "s", "x")
        asyncio.run(run(xdb))
    kept = backups.kept_backups(tmp_path / "b")
    assert len(kept) == 2 and all(verify_audit(p).ok for p in kept)


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """A data dir with the victim's and the keeper's sessions in two backups (DATA_DIR/backups and the
    backup dir), one SIGUSR1-style backup, and two exports (Parquet and JSON lines)."""
    data, dest = tmp_path / "data", tmp_path / "second-disk"
    with XDB.open(data, XDBConfig(max_latency_s=0.01)) as xdb:
        record(xdb, "victim", WORD)
        record(xdb, "keeper", "kept")
        made = [backups.write_backup(xdb, data, dest), backups.write_backup(xdb, data, data / "backups")]
        record(xdb, "victim", WORD)
        made.append(backups.write_backup(xdb, data, dest))
        xdb.export(owner=EVERY)
        xdb.export(fmt="jsonl", owner=EVERY)
    assert all(files_holding(p, WORD.encode()) for p in made)
    assert len(files_holding(data / "exports", WORD.encode())) == 2
    return data, dest, made


def check_erased(data: Path, dest: Path, made: list[Path]) -> None:
    vacuum_experience(data)  # the live file's own deleted rows leave its blocks (the storage pass does it live)
    for folder in (data, dest):
        assert files_holding(folder, WORD.encode()) == [], folder
    for path in made:
        report = verify_audit(path)
        assert report.ok, report.first_bad
        assert any(e.startswith("session 'victim'") for e in report.erased)
        assert b"victim" not in (path / "audit" / KEYS_FILE).read_bytes()  # its keys' rows gone, bytes and all
        assert sessions_in(path) == {"keeper"}
        with XDB.open(path) as copy:  # opens as a data dir, its chain intact
            assert copy.conn.execute("SELECT count(*) FROM timesteps WHERE session_id = 'keeper'").fetchone() == (4,)
    for manifest in (data / "exports").glob("*/manifest.json"):
        m = json.loads(manifest.read_text())
        assert m["rows"] == sum(t["rows"] for t in m["tables"].values()) and m["erased_sessions"] == 1
        assert all((manifest.parent / f["path"]).is_file() for t in m["tables"].values() for f in t["files"])
        assert m["tables"]["timesteps"]["rows"] == 4  # the keeper's
        with XDB.open(XDB.import_export(data.parent / f"import-{m['id']}", manifest.parent)["data_dir"]) as copy:
            assert copy.conn.execute("SELECT DISTINCT session_id FROM timesteps").fetchall() == [("keeper",)]
    assert backups.pending(data) == []


@pytest.mark.process
def test_a_deletion_reaches_every_backup_and_export(copies: tuple[Path, Path, list[Path]]) -> None:
    data, dest, made = copies
    with XDB.open(data) as xdb:
        xdb.delete_session("victim")
        backups.wait(data, timeout=60)
        # A backup made after the deletion is left alone (it holds nothing of it).
        record(xdb, "keeper", "more")
    check_erased(data, dest, made)


@pytest.mark.process
def test_a_deletion_cut_short_is_finished_at_the_next_start(copies: tuple[Path, Path, list[Path]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    data, dest, made = copies
    done: list[Path] = []
    erase = backup_erase.erase_from_backup

    def crash_after_one(backup: Path, session_id: str, stone: Tombstone | None = None) -> bool:
        if done:
            raise KeyboardInterrupt("the process dies midway")
        done.append(backup)
        return erase(backup, session_id, stone)

    monkeypatch.setattr(backups, "start_worker", lambda data_dir: None)  # run in this thread, below
    monkeypatch.setattr(backup_erase, "erase_from_backup", crash_after_one)
    with XDB.open(data) as xdb:
        xdb.delete_session("victim")
    assert [p.session_id for p in backups.pending(data)] == ["victim"]
    with pytest.raises(KeyboardInterrupt):
        backup_erase.finish_pending(data)
    assert len(done) == 1 and [p.session_id for p in backups.pending(data)] == ["victim"]  # still noted
    monkeypatch.undo()

    with XDB.open(data) as xdb:  # the next start: the server's backup loop, without a schedule
        asyncio.run(backup_forever(xdb, data, XDBConfig()))
        backups.wait(data, timeout=60)
    check_erased(data, dest, made)


@pytest.mark.process
def test_another_replicas_tombstone_reaches_the_backups_up_to_its_time(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with XDB.open(data, XDBConfig(max_latency_s=0.01)) as xdb:
        record(xdb, "victim", WORD)
        record(xdb, "keeper", "kept")
        backup = backups.write_backup(xdb, data, data / "backups")
        stone = Tombstone("replica-b", 7, "victim", hot_cutoff(0.0), "request")
        assert any(xdb._apply_tombstone(stone).values())  # what the lake shipper calls
        backups.wait(data, timeout=60)
    assert files_holding(backup, WORD.encode()) == [] and sessions_in(backup) == {"keeper"}
    report = verify_audit(backup)
    assert report.ok and any(e.startswith("session 'victim'") for e in report.erased), report.first_bad


def test_erasing_from_a_backup_notes_nothing_and_logs_no_live_anchor(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    with XDB.open(data) as xdb:
        record(xdb, "victim", WORD)
        backup = backups.write_backup(xdb, data, data / "backups")
    with caplog.at_level(logging.INFO, "ahc.xdb.audit"):
        assert backup_erase.erase_from_backup(backup, "victim")
    assert "audit head seq=" not in caplog.text  # the backup's forked head is not shipped as the live one
    assert not (backup / backups.PENDING_FILE).exists() and files_holding(backup, WORD.encode()) == []
    assert not backup_erase.erase_from_backup(backup, "victim")  # again: nothing left of it
