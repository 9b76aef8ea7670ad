"""`xdb.backend: ducklake`: one shared experience lake for a cluster of replicas.

Several `ahc serve` replicas (each its own process and its own data dir) run behind a session-affinity
router. Each keeps the embedded XDB files as its local hot buffer — the per-token write path is the
same as with `duckdb` — and a shipper thread (xdb/lake/shipper.py) copies what it has committed into a
shared DuckLake: the catalog in PostgreSQL (`xdb.lake.catalog`, a libpq connection string), the data
as Parquet files under `xdb.lake.data_path`. Every lake row carries its `replica` (`xdb.lake.replica_id`).

    xdb = XDB.open(data_dir, XDBConfig(backend="ducklake", lake=LakeConfig(catalog=..., data_path=...,
                                                                          replica_id="r1")))
    xdb.lake.ship_now() -> {table: rows}       # ship everything committed so far, now
    xdb.lake.recall(filters | **filters)       # every replica's timesteps, each with `replica`
    xdb.lake.concepts(query) ; xdb.lake.tags(tag_type)
    xdb.lake.verify_audit() -> {replica: AuditReport}   # every replica's hash chain, recomputed
    xdb.lake.status() -> {replica, rows_shipped, ships, last_ship_at, last_error, watermarks}
    (the same as XDB / RemoteXDB methods: lake_recall, lake_concepts, lake_tags, verify_lake_audit,
    lake_ship_now, lake_status; `xdb.lake` is None with the duckdb backend)

Durability, precisely. When a reply completes:
  - its token rows are committed in the replica's local files (the audit log, then experience.duckdb),
    exactly as with the duckdb backend: the server flushes the writer before the reply's last chunk;
  - they are in the lake within `ship_interval_s` (0.5 s) of that local commit, plus the time of at most
    two ships (a ship is one lake transaction, tens of milliseconds for a cycle's rows), while the
    lake is reachable and keeps up; sooner when the session's State is saved, which ships everything
    pending with it;
  - the session's State is in the lake before the reply completes while the lake is up:
    `save_session_state` commits it locally, then ships it and every row committed before it in one
    lake transaction, and raises LakeUnavailable if the lake cannot take it. The server lets the reply
    stand then (the State is stored locally, and failing the reply made clients retry and append the
    turn again): the shipper takes the State to the lake once it is back.
Rows a replica has committed locally but not yet shipped (lake down, or the replica stopped within the
interval) are never lost while its data dir is: shipping resumes from the lake's watermarks at the next
cycle or the next start, and a row is never shipped twice (rows and watermarks commit together).
Losing a replica's disk before a ship loses at most the last `ship_interval_s` of its tokens, never a
completed session State.

Resuming a session elsewhere: `load_session_state` returns the newest intact State among the local
file's and the lake's (by created_at, then version: clocks of the replicas are assumed in step) and
moves the session's ticks past the largest tick any replica shipped for it, so ticks continue.

Deleting a session sticks: `delete_session` (and retention) leaves a tombstone that is shipped like
any row; from that commit on, lake reads and State loading leave out anything older, the replica
that shipped it deletes the session's rows up to then from the lake (every replica's; in a transaction
of its own, retried while other replicas' commits win), and each other replica deletes its own copies
when its shipper next sees it (within `tombstone_poll_s`). A tombstone made while the lake is down
goes with the next ship; until then the replica that made it ignores the lake's older State itself.
What the lake does not follow: the other rewrites in the local files (compression of old rows,
`purge_run`, pruned State versions) stay local — the lake keeps the history as it was shipped, and
the audit events recording them are shipped like any audit record; documents, time windows and
compressed records are not shipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from core.config import LakeConfig
from xdb import sql
from xdb.audit.verify import AuditReport
from xdb.lake.reads import (
    NameCache,
    lake_concepts,
    lake_recall,
    lake_tags,
    last_tick,
    newest_state,
    tombstoned_at,
    verify_lake_audit,
)
from xdb.lake.schema import attach_lake
from xdb.lake.shipper import ApplyTombstone, LakeShipper, LakeUnavailable
from xdb.recall.recall import RecallFilters
from xdb.session_state import StateVersion

__all__ = ["Lake", "LakeUnavailable", "attach_lake"]


class Lake:
    """The shared lake as one replica sees it: its own in-memory DuckDB with the lake attached (so lake
    queries never take the experience file's threads), and the shipper thread, started by `start()`."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, config: LakeConfig, alias: str,
                 shipper: LakeShipper | None) -> None:
        self.conn, self.config, self.alias, self.shipper = conn, config, alias, shipper
        assert config.replica_id is not None
        self.replica: str = config.replica_id
        self._names = NameCache()  # (replica, id) -> name of concepts and tags: fixed once recorded

    @classmethod
    def open(cls, config: LakeConfig, experience: duckdb.DuckDBPyConnection | None = None,
             audit: duckdb.DuckDBPyConnection | None = None, *, alias: str = "lake",
             threads: int | None = None, on_tombstone: ApplyTombstone | None = None) -> Lake:
        """Attach the lake (creating its tables if new). With `experience` (the XDB's connection) a
        shipper is made for that file and `audit` (the audit log's connection); `start()` starts it.
        An unreachable catalog, or a data dir behind what its replica id already shipped, raises
        ValueError."""
        if not (config.catalog and config.data_path and config.replica_id):
            raise ValueError("xdb.lake needs catalog, data_path and replica_id")
        conn = duckdb.connect()
        ship_conn = None
        try:
            if threads:
                conn.execute(f"SET threads = {int(threads)}")
            attach_lake(conn, config.catalog, Path(config.data_path), alias)
            shipper = None
            if experience is not None:
                # The shipper's own DuckDB, on one thread: all its work then runs on the shipper's
                # thread, which yields the CPU to the writer (see LakeShipper), and reads keep theirs.
                ship_conn = duckdb.connect()
                ship_conn.execute("SET threads = 1")
                attach_lake(ship_conn, config.catalog, Path(config.data_path), alias)
                shipper = LakeShipper(ship_conn, alias, config.replica_id, experience, audit,
                                      interval_s=config.ship_interval_s, batch_rows=config.ship_batch_rows,
                                      tombstone_poll_s=config.tombstone_poll_s, on_tombstone=on_tombstone)
        except BaseException:
            conn.close()
            if ship_conn is not None:
                ship_conn.close()
            raise
        return cls(conn, config, alias, shipper)

    def start(self) -> None:
        """Read the watermarks (checking the data dir is not behind them) and start shipping."""
        if self.shipper is not None:
            try:
                self.shipper.start()
            except duckdb.Error as exc:
                raise ValueError(f"the lake's watermarks for replica {self.replica!r} could not be read: "
                                 f"{exc}") from exc

    def close(self) -> None:
        """Stop shipping after a last ship (see LakeShipper.stop), then detach."""
        try:
            if self.shipper is not None:
                self.shipper.stop()
        finally:
            self.conn.close()

    def cursor(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return sql.cursor(self.conn)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor for a lake read; a catalog that fails becomes LakeUnavailable."""
        with self.cursor() as cur:
            try:
                yield cur
            except duckdb.Error as exc:
                raise LakeUnavailable(f"reading the lake failed: {' '.join(str(exc).split())}") from exc

    # -- shipping ---------------------------------------------------------------------------------------
    def ship_now(self) -> dict[str, int]:
        """Ship everything committed locally so far; the rows shipped per table. Raises LakeUnavailable."""
        if self.shipper is None:
            raise ValueError("this XDB was opened read-only: nothing to ship")
        return self.shipper.ship_now()

    def follow_tombstones(self) -> int:
        """Apply now the deletions other replicas shipped (the shipper does it every `tombstone_poll_s`)."""
        if self.shipper is None:
            raise ValueError("this XDB was opened read-only: nothing to delete")
        try:
            return self.shipper.follow_tombstones()
        except duckdb.Error as exc:
            raise LakeUnavailable(f"reading the lake's tombstones failed: {' '.join(str(exc).split())}") from exc

    def status(self) -> dict[str, Any]:
        if self.shipper is None:
            return {"replica": self.replica, "running": False}
        return self.shipper.status()

    # -- reads ------------------------------------------------------------------------------------------
    def recall(self, filters: RecallFilters | dict[str, Any] | None = None, *, owner: str,
               **kwargs: Any) -> list[dict[str, Any]]:
        f = RecallFilters.parse(filters, **kwargs)
        with self._reading() as cur:
            return lake_recall(cur, self.alias, f, owner, self._names)

    def concepts(self, query: str | None = None) -> list[dict[str, Any]]:
        with self._reading() as cur:
            return lake_concepts(cur, self.alias, query)

    def tags(self, tag_type: str | None = None) -> list[dict[str, Any]]:
        with self._reading() as cur:
            return lake_tags(cur, self.alias, tag_type)

    def verify_audit(self) -> dict[str, AuditReport]:
        with self._reading() as cur:
            return verify_lake_audit(cur, self.alias)

    def session_resume(self, session_id: str, deleted_at: datetime | None = None) -> Resume:
        """What the lake holds to resume a session: see Resume. `deleted_at` is when this replica last
        saw the session deleted: no State saved up to then (or up to the lake's own tombstone) is taken."""
        with self._reading() as cur:
            lake_deleted = tombstoned_at(cur, self.alias, session_id)
            cutoff = max((t for t in (deleted_at, lake_deleted) if t is not None), default=None)
            state, corrupt = newest_state(cur, self.alias, session_id, cutoff)
            return Resume(state, corrupt, last_tick(cur, self.alias, session_id), lake_deleted)


@dataclass(frozen=True)
class Resume:
    """The session's newest intact State in the lake (after its last deletion), how many newer ones
    were corrupt, the largest tick any replica shipped for it (-1: none), and when a replica last
    deleted it (None: never)."""

    state: StateVersion | None
    corrupt: int
    last_tick: int
    deleted_at: datetime | None
