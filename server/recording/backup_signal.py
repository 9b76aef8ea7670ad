"""A consistent backup of the experience database while the server runs, on SIGUSR1.

DuckDB files belong to the one process writing them, so a copy from outside is either refused (the
lock) or torn. On `kill -USR1 <ahc serve pid>` (`docker compose kill -s SIGUSR1 ahc`) the server copies
both files itself, from one snapshot each, while generation and recording go on, into
`DATA_DIR/backups/<UTC time>/`: a directory `ahc serve --data-dir` or `XDB.open` takes as it is. It is
written under a `.partial-` name and renamed when complete, so whatever waits for it never sees half a
backup. `scripts/backup.sh` sends the signal and waits. A session deleted later is removed from the
backups kept there (xdb/storage/backups.py); `xdb.backup_every_s` backs up on a schedule
(server/recording/backup_loop.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from xdb import XDBClient
from xdb.storage import backups

log = logging.getLogger("ahc.backup")

BACKUPS_DIR = backups.BACKUPS_DIR


def install_backup_signal(xdb: XDBClient, data_dir: Path) -> None:
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[Path | None]] = set()  # held, or the loop may drop a task mid-backup

    def start() -> None:
        if running:
            log.warning("a backup is already being written; this signal is ignored")
            return
        task = loop.create_task(backup_now(xdb, data_dir))
        running.add(task)
        task.add_done_callback(running.discard)

    loop.add_signal_handler(signal.SIGUSR1, start)


async def backup_now(xdb: XDBClient, data_dir: Path) -> Path | None:
    log.info("backup of %s started", data_dir)
    try:
        # Under the backup directory's lock, marked with its start time: a session deleted later is
        # erased from it too (xdb/storage/backups.py).
        final = await asyncio.to_thread(backups.write_backup, xdb, data_dir, data_dir / BACKUPS_DIR)
    except Exception:  # reported, and the server serves on: a failed backup must not stop generation
        log.exception("backup of %s into %s failed", data_dir, data_dir / BACKUPS_DIR)
        return None
    log.info("backup of %s written to %s", data_dir, final)
    return final
