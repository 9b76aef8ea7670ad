"""Deleting a deleted session's rows from the lake, apart from shipping them.

DuckLake aborts a commit that deletes from a table another writer inserted into (or deleted from)
since the transaction began. With every replica shipping about twice a second, a delete made in the
same transaction as a ship would lose again and again, and take the ship (the tombstone with it)
down. So a tombstone is shipped like any other row, an insert that never conflicts, and from that
commit on every lake read leaves out what it covers. The rows it covers are then deleted in short
transactions of their own, run again while they lose to another replica's commit and left for the
next cycle when they keep losing.

A replica records in `lake_watermarks` (table name PURGED) the last of its own tombstones whose rows
it deleted; after a restart it purges again the tombstones it shipped past that mark.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import duckdb
import pyarrow as pa

from xdb.lake.schema import TOMBSTONED, rollback
from xdb.sql import string_literal

log = logging.getLogger("ahc.xdb.lake")

PURGED = "session_tombstones/purged"  # lake_watermarks.table_name of the purge mark
# A lost transaction is run again this many times, CONFLICT_WAIT_S apart and doubling (0.14 s in all);
# one that still loses waits for the next cycle.
CONFLICT_ATTEMPTS = 4
CONFLICT_WAIT_S = 0.02


@dataclass(frozen=True)
class Purge:
    """The rows of a deleted session, up to its deletion, to delete from the lake."""

    session_id: str
    deleted_at: datetime
    only_mine: bool                   # only this replica's rows (another's tombstone), else every replica's
    tombstone_id: int | None = None   # this replica's own tombstone, whose purge is recorded


def lost_a_race(exc: BaseException) -> bool:
    """Whether a lake commit failed only because other writers' commits came first: a conflict, or
    more wins by others than DuckLake's own retries of a commit without one (ducklake_max_retry_count)."""
    return isinstance(exc, duckdb.TransactionException) and any(
        why in str(exc) for why in ("Transaction conflict", "maximum retry count"))


def retried_on_conflict(work: Callable[[], None]) -> None:
    """Run `work`, one whole lake transaction, again while it loses to another writer's commit."""
    for attempt in range(CONFLICT_ATTEMPTS):
        try:
            work()
            return
        except duckdb.TransactionException as exc:
            if not lost_a_race(exc) or attempt == CONFLICT_ATTEMPTS - 1:
                raise
            time.sleep(CONFLICT_WAIT_S * 2 ** attempt)


class LakePurger:
    """The purges a replica owes the lake, run through the shipper's lake cursor (under its lock)."""

    def __init__(self, lake: duckdb.DuckDBPyConnection, alias: str, replica: str) -> None:
        self._lake, self.alias, self.replica = lake, alias, replica
        self.pending: list[Purge] = []
        self.purged_to = 0  # this replica's tombstones up to this id have had their rows deleted

    def load(self, purged_to: int) -> None:
        """The lake as read back: this replica's tombstones shipped past the mark are purged again."""
        rows = self._lake.execute(f"SELECT id, session_id, deleted_at FROM {self.alias}.session_tombstones "
                                  "WHERE replica = ? AND id > ? ORDER BY id", [self.replica, purged_to]).fetchall()
        self.purged_to = purged_to
        self.pending = [p for p in self.pending if p.tombstone_id is None]
        self.pending += [Purge(str(s), at, only_mine=False, tombstone_id=int(i)) for i, s, at in rows]

    def add(self, purges: list[Purge]) -> None:
        self.pending += purges

    def run(self) -> bool:
        """Delete every pending purge's rows in one lake transaction. False: it kept losing to other
        writers' commits, and stays pending (lake reads leave its rows out meanwhile)."""
        if not self.pending:
            return True
        batch = list(self.pending)
        try:
            retried_on_conflict(lambda: self._commit(batch))
        except duckdb.TransactionException as exc:
            if not lost_a_race(exc):
                raise
            log.warning("lake shipper (replica %s): deleting %d deleted session(s)' rows from the lake lost to "
                        "other replicas' commits %d times; tried again next cycle", self.replica, len(batch),
                        CONFLICT_ATTEMPTS)
            return False
        self.pending = self.pending[len(batch):]
        self.purged_to = max([self.purged_to, *(p.tombstone_id for p in batch if p.tombstone_id is not None)])
        return True

    def _commit(self, batch: list[Purge]) -> None:
        a, cur, me = self.alias, self._lake, string_literal(self.replica)
        purges = pa.table({"session_id": pa.array([p.session_id for p in batch], pa.string()),
                           "deleted_at": pa.array([p.deleted_at for p in batch], pa.timestamp("us")),
                           "only_mine": pa.array([p.only_mine for p in batch], pa.bool_())})
        own = max((p.tombstone_id for p in batch if p.tombstone_id is not None), default=None)
        cur.register("xdb_purge", purges)
        cur.execute("BEGIN")
        try:
            for table, column in TOMBSTONED:
                cur.execute(f"DELETE FROM {a}.{table} t WHERE EXISTS (SELECT 1 FROM xdb_purge p "
                            f"WHERE p.session_id = t.session_id AND t.{column} <= p.deleted_at "
                            f"AND (NOT p.only_mine OR t.replica = {me}))")
            if own is not None and own > self.purged_to:
                cur.execute(f"INSERT INTO {a}.lake_watermarks VALUES ({me}, '{PURGED}', {int(own)}, now(), NULL)")
            cur.execute("COMMIT")
        except BaseException:
            rollback(cur)
            raise
        finally:
            cur.unregister("xdb_purge")
