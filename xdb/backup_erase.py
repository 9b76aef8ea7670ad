"""Erasing deleted sessions from the kept backups and exports, and verifying a backup: what the child
process of xdb/storage/backups.py runs (`CHILD erase DATA_DIR`, `CHILD verify BACKUP`). Each backup is opened as
the XDB it is, offline, so this module stands above the store; xdb/storage/backups.py, which the live store
calls when it deletes, only notes the deletion and starts the child."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from core.errors import NotFound
from xdb.audit.log import verify_audit
from xdb.schema import EXPERIENCE_FILE
from xdb.storage.backups import (
    EXPORTS_DIR,
    PENDING_LOCK,
    RUN_LOCK,
    Pending,
    erase_from_export,
    flock_file,
    kept_backups,
    known_dirs,
    locked,
    pending,
    quiet,
    save_pending,
    started_at,
    wait_for_exports_in_flight,
)
from xdb.storage.retention import Tombstone
from xdb.storage.vacuum import vacuum_experience
from xdb.store import XDB

log = logging.getLogger("ahc.xdb.backups")


def finish_pending(data_dir: Path) -> list[str]:
    """Erase every noted session from every kept backup and export made before its deletion; the
    sessions done (their notes removed)."""
    data_dir = Path(data_dir)
    done = []
    with flock_file(data_dir / RUN_LOCK):  # one process at a time erases (the service's thread, a start's)
        for entry in pending(data_dir):
            erase_everywhere(data_dir, entry)
            with flock_file(data_dir / PENDING_LOCK):
                save_pending(data_dir, [e for e in pending(data_dir) if e != entry])
            done.append(entry.session_id)
    return done


def erase_everywhere(data_dir: Path, entry: Pending) -> None:
    for dest_dir in known_dirs(data_dir):
        if not dest_dir.is_dir():
            continue
        with locked(dest_dir):
            for backup in kept_backups(dest_dir):
                started = started_at(backup)
                if started is None or started <= entry.deleted_at:
                    erase_from_backup(backup, entry.session_id, entry.stone())
    exports = data_dir / EXPORTS_DIR
    wait_for_exports_in_flight(exports)
    if exports.is_dir():
        for export_dir in sorted(exports.iterdir()):
            if (export_dir / "manifest.json").is_file():
                erase_from_export(export_dir, entry.session_id)


def erase_from_backup(backup: Path, session_id: str, stone: Tombstone | None = None) -> bool:
    """Delete the session in an offline backup as the live XDB does (its audit log chains the deletion
    and destroys its keys there; `stone`: its rows up to another replica's deletion, as the live file
    applied it), then rewrite its experience file whole; False: it held nothing of it."""
    quiet.on = True
    try:
        with XDB.open(backup) as copy:
            try:
                deleted: dict[str, int] | None = copy.delete_session(session_id) if stone is None \
                    else copy._apply_tombstone(stone)
            except NotFound:
                deleted = None
    finally:
        quiet.on = False
    if deleted is None or not any(deleted.values()):
        return False
    vacuum_experience(backup)
    (backup / (EXPERIENCE_FILE + ".wal")).unlink(missing_ok=True)
    log.info("session %r erased from the backup %s (%d rows)", session_id, backup, sum(deleted.values()))
    return True


def verify_here(path: Path) -> tuple[bool, str | None]:
    try:
        report = verify_audit(path)
    except Exception as exc:  # noqa: BLE001 - an unreadable copy is a failed one
        return False, f"{type(exc).__name__}: {exc}"
    return report.ok, report.first_bad


def main(argv: list[str]) -> int:
    """The child process xdb/storage/backups.py starts (`CHILD erase DATA_DIR` / `CHILD verify BACKUP`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(argv) != 2 or argv[0] not in ("erase", "verify"):
        print("usage: erase DATA_DIR | verify BACKUP", file=sys.stderr)
        return 2
    if argv[0] == "verify":
        ok, fault = verify_here(Path(argv[1]))
        print(json.dumps({"ok": ok, "first_bad": fault}))
        return 0
    finish_pending(Path(argv[1]))
    return 0
