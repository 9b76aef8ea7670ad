"""Scheduled backups of the experience database while the server runs (`xdb.backup_every_s`).

Every `backup_every_s` the primary API process writes a backup (as SIGUSR1 does, server/recording/
backup_signal.py) into `xdb.backup_dir` (meant to be another disk; default DATA_DIR/backups), verifies
the copy's audit chain as `ahc xdb verify-audit` does, and keeps the newest `xdb.backup_keep` of its
backups, deleting older ones (backups made on demand, by SIGUSR1, are left to the operator). A copy that
fails verification is logged at ERROR, counted (`BackupLoop.failed`, and `on_result`) and removed, so it
is never kept as a good one.

Before its first backup it finishes the erasures a stop or a crash cut short: sessions deleted since a
backup or export under the data dir (or the backup dir) was made are removed from it (xdb/storage/backups.py);
this runs with or without a schedule.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import XDBConfig
from xdb.storage import backups

log = logging.getLogger("ahc.backup")


@dataclass
class BackupLoop:
    """One pass (`once`) and the loop (`run`); `on_result` hears each pass's report."""

    xdb: backups.Backs
    data_dir: Path
    dest_dir: Path
    keep: int
    on_result: Callable[[dict[str, Any]], None] | None = None
    written: int = 0
    failed: int = 0
    last: dict[str, Any] = field(default_factory=dict)

    def once(self) -> dict[str, Any]:
        """Write a backup, verify it, drop the old ones: {"path", "ok", "error", "removed"}."""
        report: dict[str, Any] = {"path": None, "ok": False, "error": None, "removed": []}
        try:
            path = backups.write_backup(self.xdb, self.data_dir, self.dest_dir, scheduled=True)
        except Exception as exc:  # reported; the server serves on
            log.exception("scheduled backup of %s into %s failed", self.data_dir, self.dest_dir)
            report["error"] = f"{type(exc).__name__}: {exc}"
            return self._done(report)
        report["path"] = str(path)
        ok, fault = backups.verify_backup(path)
        if not ok:
            log.error("backup %s failed verification (%s): removed", path, fault)
            with backups.locked(self.dest_dir):
                shutil.rmtree(path, ignore_errors=True)
            report["error"] = fault
            return self._done(report)
        report["ok"] = True
        report["removed"] = [str(p) for p in backups.prune(self.dest_dir, self.keep)]
        log.info("backup of %s written to %s and verified; %d old backup(s) removed", self.data_dir, path,
                 len(report["removed"]))
        return self._done(report)

    def _done(self, report: dict[str, Any]) -> dict[str, Any]:
        if report["ok"]:
            self.written += 1
        else:
            self.failed += 1
        self.last = report
        if self.on_result is not None:
            self.on_result(report)
        return report

    async def run(self, every_s: float | None) -> None:
        """Finish the erasures left pending, then (with `every_s`) back up every `every_s` until cancelled."""
        worker = await asyncio.to_thread(backups.start_worker, self.data_dir)
        if worker is not None:
            log.info("erasing deleted sessions from the backups and exports of %s, left pending", self.data_dir)
        if every_s is None:
            return
        while True:
            await asyncio.sleep(every_s)
            await asyncio.to_thread(self.once)


async def backup_forever(xdb: backups.Backs, data_dir: Path, config: XDBConfig,
                         on_result: Callable[[dict[str, Any]], None] | None = None) -> None:
    """The server's loop (`xdb.backup_every_s`, `xdb.backup_dir`, `xdb.backup_keep`), until cancelled."""
    loop = BackupLoop(xdb, Path(data_dir), backups.backup_dir(Path(data_dir), config.backup_dir), config.backup_keep,
                      on_result)
    await loop.run(config.backup_every_s)
