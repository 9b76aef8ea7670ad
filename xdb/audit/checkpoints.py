"""The audit log's checkpoints, taken a DuckDB row group at a time.

A checkpoint writes what was appended since the last one as row groups of its own (DuckDB does not
append to the row group a checkpoint left), and DuckDB's vacuum merges small ones by rewriting them,
leaving the blocks of the copies it replaced free in the file: at the end of bench/audit_bytes.py's 2M
tokens, between 1 and 87 free blocks of 256 KiB (over 80 in five runs of eight: 11 bytes a token), and
a checkpoint that merges took up to 1.4 s against ~0.3 s. The log is append-only, so its connection turns
the merges off (`max_vacuum_tasks = 0`; a row group every record of which was retired is still dropped),
and checkpoints come when the next commit might not fit in the row group begun since the last, rather
than at a size of write-ahead log: each writes one row group nearly full and rewrites nothing. Measured
there: no block free, 473 in use (455 in use with the merges), checkpoints up to 0.6 s.

With the merges off, a row group a checkpoint writes keeps its deleted rows' bytes: audit_replay, whose rows
leave as soon as the experience file holds them, is emptied just before (`before`), so none of it is written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import duckdb

from xdb import checkpoints
from xdb.checkpoints import QuietCheckpoints

log = logging.getLogger("ahc.xdb.audit")

ROW_GROUP_ROWS = 122_880  # DuckDB's default row group size
# Long records fill the write-ahead log before a row group: checkpointed at this many times QUIET_BYTES,
# well under DuckDB's own ceiling (checkpoints.CEILING), which would checkpoint inside a commit somebody
# waits for.
WAL_QUIET_TIMES = 3


class RowGroupCheckpoints(QuietCheckpoints):
    """The writer's checkpoints of the audit file. `committed`: how many records the log has committed so
    far (its next seq), and the most one commit has brought."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, lock: threading.Lock,
                 committed: Callable[[], tuple[int, int]], before: Callable[[], None] | None = None) -> None:
        super().__init__(conn, lock)
        self._held = lock
        self._committed = committed
        self._before = before  # run first, under the lock (the log empties audit_replay)
        self._since = committed()[0]  # where the row group the next checkpoint writes begins

    def run_if_due(self) -> bool:
        """Checkpoint if the next commit might not fit in the row group begun since the last checkpoint (or
        the write-ahead log has reached WAL_QUIET_TIMES × QUIET_BYTES); False when not due or DuckDB declines."""
        now, step = self._committed()
        if now - self._since + step <= ROW_GROUP_ROWS and self.wal_bytes() < WAL_QUIET_TIMES * checkpoints.QUIET_BYTES:
            return False
        try:
            with self._held:
                if self._before is not None:
                    self._before()
                self._conn.execute("CHECKPOINT")
        except duckdb.Error as exc:
            log.info("audit checkpoint put off: %s", exc)
            return False
        self._since = now
        return True
