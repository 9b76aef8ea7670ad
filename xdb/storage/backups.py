"""The backups and exports kept on this machine, and deletions that reach them.

Backups are written by the server (`server/recording/backup_loop.py` on a schedule, SIGUSR1 on demand)
into a backup directory: DATA_DIR/backups, or `xdb.backup_dir` (another disk). Each is a data directory
named by its UTC start time, written under a `.partial-` name and renamed when complete, with a small
`ahc-backup.json` beside its files (when it was started, its audit seq). Every directory a backup was
written to is noted in DATA_DIR/backup-dirs.json, so a deletion finds its backups after `backup_dir`
changed.

A deleted session (`XDB.delete_session`, retention, a deletion a crash cut short and the next start
finished) is noted in DATA_DIR/erase-copies.json, and a thread of its own removes it from every copy
made before the deletion:

- every kept backup in those directories: the backup is opened as the XDB it is (offline, nothing
  live waits on it) and the session deleted there as in the live file, so the backup's own audit log
  chains the deletion and destroys the session's keys in the backup's `audit.keys` (its sealed records
  stay, unreadable, and its chain still verifies, the erasure named as one by policy); then its
  experience file is rewritten whole (xdb/storage/vacuum.py), so the deleted rows leave its blocks;
- every export under DATA_DIR/exports: the session's partition files, and their rows in the manifest.

No XDB lock is held meanwhile: the live XDB is not touched, and the work runs in a child process
(xdb/backup_erase.py: its hashing and rewriting take none of the service's or the API process's GIL). The
note is removed once every copy is done, so a crash midway leaves it for the next start, which does it
again (each step repeats harmlessly). A backup being written while the deletion runs is waited for: writing a backup and
erasing from backups take the same lock on the backup directory (a file lock, so across processes).

Not reached: copies anywhere else — backups written with `ahc xdb backup --out` or `XDB.backup(dest)`
to another path, exports made with an explicit `out`, and anything copied off the machine.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow.parquet as pq

from xdb.private import fsync_path, private_dir, private_files
from xdb.schema import EXPERIENCE_FILE
from xdb.storage.retention import Tombstone

log = logging.getLogger("ahc.xdb.backups")

BACKUPS_DIR = "backups"  # DATA_DIR/backups: where backups go unless `xdb.backup_dir` names another
EXPORTS_DIR = "exports"
DIRS_FILE = "backup-dirs.json"  # in DATA_DIR: every directory backups were written to
PENDING_FILE = "erase-copies.json"  # in DATA_DIR: deleted sessions not yet erased from every copy
MARK_FILE = "ahc-backup.json"  # in each backup: when it was started, its audit seq
PENDING_LOCK = ".erase-copies.lock"  # in DATA_DIR: an edit of PENDING_FILE
RUN_LOCK = ".erase-copies.run.lock"  # in DATA_DIR: erasing from the copies
LOCK_FILE = ".lock"  # in each backup directory: writing a backup, or erasing from its backups
STAMP = re.compile(r"^\d{8}T\d{6}Z(-\d+)?$")
IN_FLIGHT_EXPORT_WAIT_S = 600.0
# The child process erasing and verifying run in (xdb/backup_erase.py, which opens the copies as XDBs: this
# module, which the live XDB imports, does not import it).
CHILD = (sys.executable, "-c", "import sys; from xdb.backup_erase import main; sys.exit(main(sys.argv[1:]))")


class Backs(Protocol):
    def backup(self, dest: Path | str) -> dict[str, Any]: ...


# -- backup directories and their backups ------------------------------------------------------------
def default_dir(data_dir: Path) -> Path:
    return Path(data_dir) / BACKUPS_DIR


def backup_dir(data_dir: Path, configured: str | None) -> Path:
    return Path(configured).expanduser() if configured else default_dir(data_dir)


def known_dirs(data_dir: Path) -> list[Path]:
    """DATA_DIR/backups and every directory a backup of this data dir was written to."""
    found = [default_dir(data_dir)]
    path = Path(data_dir) / DIRS_FILE
    if path.is_file():
        try:
            found += [Path(p) for p in json.loads(path.read_text())]
        except (OSError, ValueError):
            log.warning("%s is unreadable; only %s is searched for backups", path, found[0])
    unique: list[Path] = []
    for d in found:
        if d.resolve() not in {u.resolve() for u in unique}:
            unique.append(d)
    return unique


def _remember_dir(data_dir: Path, dest_dir: Path) -> None:
    if dest_dir.resolve() == default_dir(data_dir).resolve():
        return
    dirs = [str(d) for d in known_dirs(data_dir)[1:]]
    if str(dest_dir.resolve()) not in dirs:
        _write_json(Path(data_dir) / DIRS_FILE, [*dirs, str(dest_dir.resolve())])


def kept_backups(dest_dir: Path) -> list[Path]:
    """The complete backups in `dest_dir`, oldest first (by name: their UTC start time)."""
    if not dest_dir.is_dir():
        return []
    return sorted((p for p in dest_dir.iterdir() if STAMP.match(p.name) and (p / EXPERIENCE_FILE).is_file()),
                  key=lambda p: p.name)


@contextlib.contextmanager
def flock_file(path: Path) -> Iterator[None]:
    """A file lock: across processes, and across threads (each takes it through an open of its own)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def locked(dest_dir: Path) -> contextlib.AbstractContextManager[None]:
    """The backup directory to oneself: writing a backup, or erasing sessions from its backups."""
    private_dir(dest_dir)
    return flock_file(dest_dir / LOCK_FILE)


def write_backup(xdb: Backs, data_dir: Path, dest_dir: Path, *, scheduled: bool = False) -> Path:
    """A backup of the live XDB into `dest_dir`/<UTC time>/ (written under a `.partial-` name, renamed
    when complete); the directory is noted so that deletions reach it. `scheduled`: one of the loop's,
    which `prune` may delete (an operator's backup on demand is never pruned)."""
    data_dir, dest_dir = Path(data_dir), Path(dest_dir)
    private_dir(dest_dir)
    _remember_dir(data_dir, dest_dir)
    with locked(dest_dir):
        started = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
        final, n = dest_dir / stamp, 1
        while final.exists() or final.with_name(f".partial-{final.name}").exists():
            final, n = dest_dir / f"{stamp}-{n}", n + 1
        partial = final.with_name(f".partial-{final.name}")
        try:
            result = xdb.backup(partial)
            _write_json(partial / MARK_FILE, {"started_at": started, "audit_seq": result["audit_seq"],
                                              "scheduled": scheduled})
            partial.rename(final)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    fsync_path(dest_dir)
    return final


def verify_backup(path: Path) -> tuple[bool, str | None]:
    """The backup's audit chain, as `ahc xdb verify-audit` checks it, in a child process (re-hashing
    the chain takes none of the caller's GIL): (ok, the first fault)."""
    done = subprocess.run([*CHILD, "verify", str(path)], capture_output=True,
                          text=True, check=False)
    try:
        verdict = json.loads(done.stdout.strip().splitlines()[-1])
        return bool(verdict["ok"]), verdict["first_bad"]
    except (ValueError, IndexError, KeyError, TypeError):
        return False, f"verification exited {done.returncode}: {done.stderr.strip()[-500:]}"


def prune(dest_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` scheduled backups in `dest_dir`; the ones deleted."""
    with locked(dest_dir):
        scheduled = [p for p in kept_backups(dest_dir) if _mark(p).get("scheduled") is True]
        old = scheduled[:-keep] if keep > 0 else scheduled
        for path in old:
            shutil.rmtree(path)
    return old


def _mark(backup: Path) -> dict[str, Any]:
    try:
        mark = json.loads((backup / MARK_FILE).read_text())
    except (OSError, ValueError):
        return {}  # a backup from before the mark
    return mark if isinstance(mark, dict) else {}


def started_at(backup: Path) -> float | None:
    try:
        return float(_mark(backup)["started_at"])
    except (KeyError, ValueError, TypeError):
        return None  # a backup from before the mark: treated as older than any deletion


# -- deletions reaching the copies ---------------------------------------------------------------------
@dataclass(frozen=True)
class Pending:
    session_id: str
    deleted_at: float  # time.time() once the live deletion was done
    # Another replica's deletion (xdb/lake/lake.py): the copies drop the session's rows up to it, as the live
    # file did. None: every row of the session in a copy made before `deleted_at`.
    tombstone: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "deleted_at": self.deleted_at,
                **({"tombstone": self.tombstone} if self.tombstone is not None else {})}

    def stone(self) -> Tombstone | None:
        t = self.tombstone
        return None if t is None else Tombstone(str(t["replica"]), int(t["id"]), self.session_id,
                                                dt.datetime.fromisoformat(t["deleted_at"]), str(t["reason"]))


quiet = threading.local()  # set while erasing from a backup: that XDB's own deletion notes nothing
_workers: dict[Path, threading.Thread] = {}
_workers_lock = threading.Lock()


def pending(data_dir: Path) -> list[Pending]:
    path = Path(data_dir) / PENDING_FILE
    if not path.is_file():
        return []
    try:
        return [Pending(str(e["session_id"]), float(e["deleted_at"]), e.get("tombstone"))
                for e in json.loads(path.read_text())]
    except (OSError, ValueError, KeyError, TypeError):
        log.error("%s is unreadable: deleted sessions it named may stay in backups and exports", path)
        return []


def save_pending(data_dir: Path, entries: list[Pending]) -> None:
    path = Path(data_dir) / PENDING_FILE
    if not entries:
        path.unlink(missing_ok=True)
        return
    _write_json(path, [e.as_json() for e in entries])


def session_deleted(data_dir: Path, session_id: str, stone: Tombstone | None = None) -> None:
    """The live XDB deleted `session_id` (`stone`: as another replica's tombstone says): note it
    (durably), and erase it from the copies on a thread of its own (the caller's locks are not held
    there)."""
    if getattr(quiet, "on", False):
        return
    data_dir = Path(data_dir)
    tombstone = None if stone is None else {"replica": stone.replica, "id": stone.id, "reason": stone.reason,
                                            "deleted_at": stone.deleted_at.isoformat()}
    with flock_file(data_dir / PENDING_LOCK):
        entries = [e for e in pending(data_dir) if e.session_id != session_id]
        save_pending(data_dir, [*entries, Pending(session_id, time.time(), tombstone)])
    start_worker(data_dir)


def start_worker(data_dir: Path) -> threading.Thread | None:
    """Erase the noted sessions from the copies on a thread (None: nothing is noted); one per data dir
    at a time, and it goes on while notes arrive."""
    data_dir = Path(data_dir)
    with _workers_lock:
        running = _workers.get(data_dir)
        if running is not None and running.is_alive():
            return running
        if not pending(data_dir):
            return None
        thread = threading.Thread(target=_work, args=(data_dir,), name="ahc-erase-copies", daemon=True)
        _workers[data_dir] = thread
        thread.start()
        return thread


def _work(data_dir: Path) -> None:
    """The work itself runs in a child process when there is a copy to erase from: opening, hashing and
    rewriting copies then takes none of this process's GIL (the XDB service's writer, or a process
    streaming tokens), and a crash there leaves the note for the next start."""
    while True:
        try:
            if has_copies(data_dir):
                done = subprocess.run([*CHILD, "erase", str(data_dir)], check=False)
                if done.returncode != 0:
                    log.error("erasing deleted sessions from the backups and exports of %s failed (exit %d); "
                              "retried at the next start", data_dir, done.returncode)
                    return
            else:
                clear_pending(data_dir)  # nothing to open: the notes are done
        except Exception:  # noqa: BLE001 - logged; the note stays for the next start
            log.exception("erasing deleted sessions from the backups and exports of %s failed; retried at the "
                          "next start", data_dir)
            return
        with _workers_lock:
            if not pending(data_dir):
                _workers.pop(data_dir, None)
                return


def wait(data_dir: Path, timeout: float | None = None) -> None:
    """Wait for the erasing thread of `data_dir` to finish (tests, shutdown)."""
    with _workers_lock:
        thread = _workers.get(Path(data_dir))
    if thread is not None:
        thread.join(timeout)


def _partition_names(column: str, session_id: str, manifest: dict[str, Any]) -> set[str]:
    names = {f"{column}={urllib.parse.quote(session_id, safe='')}"}
    names |= {f"{column}={key}" for key, value in manifest.get("long_ids", {}).items() if value == session_id}
    return names


def _file_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        return int(pq.ParquetFile(path).metadata.num_rows)
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def erase_from_export(export_dir: Path, session_id: str) -> int:
    """Remove the session's partition files from an export and from its manifest; the rows removed.
    Tables not partitioned by session (the concept vocabulary, tags, documents) are left as they are."""
    try:
        return _erase_from_export(export_dir, session_id)
    except FileNotFoundError:
        return 0  # deleted meanwhile (expired, or by its tenant)


def _erase_from_export(export_dir: Path, session_id: str) -> int:
    manifest_path = export_dir / "manifest.json"
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return 0  # deleted meanwhile, or not an export
    removed_rows, changed = 0, False
    for table in manifest.get("tables", {}).values():
        column = table.get("partitioned_by")
        if not column:
            continue
        names = _partition_names(column, session_id, manifest)
        kept = []
        for entry in table["files"]:
            if not set(Path(entry["path"]).parts) & names:
                kept.append(entry)
                continue
            changed = True
            path = export_dir / entry["path"]
            if path.is_file():
                rows = _file_rows(path)
                path.unlink()
                with contextlib.suppress(OSError):
                    path.parent.rmdir()
                table["rows"] -= rows
                removed_rows += rows
        table["files"] = kept
    if changed:
        manifest["rows"] -= removed_rows
        manifest["erased_sessions"] = int(manifest.get("erased_sessions", 0)) + 1
        if "long_ids" in manifest:
            manifest["long_ids"] = {k: v for k, v in manifest["long_ids"].items() if v != session_id}
            if not manifest["long_ids"]:
                del manifest["long_ids"]
        tmp = manifest_path.with_name(manifest_path.name + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        private_files(tmp)
        os.replace(tmp, manifest_path)
        log.info("session %r erased from the export %s (%d rows)", session_id, export_dir, removed_rows)
    return removed_rows


def clear_pending(data_dir: Path) -> None:
    """No copy is kept: every note is done."""
    with flock_file(data_dir / RUN_LOCK), flock_file(data_dir / PENDING_LOCK):
        save_pending(data_dir, [])


def has_copies(data_dir: Path) -> bool:
    """Whether a backup or an export is kept where deletions reach."""
    exports = Path(data_dir) / EXPORTS_DIR
    return any(kept_backups(d) for d in known_dirs(data_dir)) or (
        exports.is_dir() and any(d.is_dir() for d in exports.iterdir()))


def wait_for_exports_in_flight(exports: Path) -> None:
    """An export being written (a directory without its manifest yet) may hold the session: wait for it."""
    deadline = time.monotonic() + IN_FLIGHT_EXPORT_WAIT_S
    while exports.is_dir() and time.monotonic() < deadline:
        young = [d for d in exports.iterdir() if d.is_dir() and not (d / "manifest.json").exists()
                 and time.time() - d.stat().st_mtime < IN_FLIGHT_EXPORT_WAIT_S]
        if not young:
            return
        time.sleep(0.5)


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    private_files(tmp)
    os.replace(tmp, path)


class _QuietAnchors(logging.Filter):
    """A backup's audit log anchors its own head when a deletion is chained there: not logged as the live
    log's anchor (`audit head seq=...` lines are what a log shipper carries off as the live head)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(quiet, "on", False) and str(record.msg).startswith("audit head seq="))


logging.getLogger("ahc.xdb.audit").addFilter(_QuietAnchors())


