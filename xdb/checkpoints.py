"""Checkpoints of a DuckDB file taken when the writer chooses, not inside a commit somebody waits for.

DuckDB checkpoints a file in the commit that takes its write-ahead log past `checkpoint_threshold`
(16 MiB by default): it writes what the WAL holds into the file's row groups, 100-200 ms for ~30k token
rows with their activations. A reply's end waits for XDB's next commit (the reply is durable before the
client sees it complete), so every reply ending during such a commit waited for the checkpoint too, and
with many streams the replies end in waves. Here DuckDB's own threshold becomes a ceiling, reached only
when the writer never finds a quiet moment, and the writer checkpoints at QUIET_BYTES after a commit
that no flush is waiting on.
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from pathlib import Path

import duckdb

log = logging.getLogger(__name__)

QUIET_BYTES = 16 * 1024**2  # DuckDB's own default threshold
CEILING = "64MiB"


class QuietCheckpoints:
    """The checkpoints of the file `conn` is on. `lock`: held around the checkpoint where other threads
    use `conn` too."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, lock: threading.Lock | None = None) -> None:
        self._conn, self._lock = conn, lock
        self._put_off = 0  # checkpoints put off since the last taken
        row = conn.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
        self._wal = Path(f"{row[0]}.wal") if row and row[0] else None  # None: in memory, nothing to do
        conn.execute(f"SET checkpoint_threshold = '{CEILING}'")

    def wal_bytes(self) -> int:
        if self._wal is None:
            return 0
        try:
            return self._wal.stat().st_size
        except FileNotFoundError:  # DuckDB removes the WAL at each checkpoint
            return 0

    def run_if_due(self) -> bool:
        """Checkpoint if the WAL has reached QUIET_BYTES; False when not due or when DuckDB declines
        (a transaction in the way), so the next quiet moment tries again."""
        if self.wal_bytes() < QUIET_BYTES:
            return False
        try:
            with self._lock or nullcontext():
                self._conn.execute("CHECKPOINT")
        except duckdb.Error as exc:
            # Once a streak: a long transaction (a segment being written) puts it off at every commit.
            log.log(logging.DEBUG if self._put_off else logging.INFO, "XDB checkpoint of %s put off: %s",
                    self._wal, exc)
            self._put_off += 1
            return False
        if self._put_off:
            log.info("XDB checkpoint of %s taken after %d put off", self._wal, self._put_off)
            self._put_off = 0
        return True
