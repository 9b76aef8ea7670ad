"""The lake shipper: a thread that copies what a replica has committed locally into the shared lake.

Every `interval_s` (and on `ship_now()`) one cycle:
  1. reads, in one snapshot of each local file (a read transaction on the shipper's own cursors of the
     experience connection and of the audit log's), every table's rows past its watermark — at most
     `batch_rows` a table — as Arrow tables;
  2. inserts them all into the lake, with the advanced watermarks, in ONE lake transaction;
  3. deletes from the lake the rows of the sessions whose tombstones it shipped, in a transaction of
     their own (xdb/lake/purge.py: a delete is what loses to another replica's commit).
So the lake holds a table's rows exactly up to its watermark: a crash before the lake's commit ships
nothing (the next cycle reads the same rows again), one after it has shipped them and their watermark
together. A commit whose outcome is unknown (the catalog went away during COMMIT) makes the next cycle
read the watermarks back from the lake first. The writer is never waited on: the shipper only reads
committed rows, through cursors of its own.

What a table has shipped (see xdb/lake/schema.py for each table's mode):
  - "id" tables (timesteps and concepts, committed by the one writer thread in id order; the audit's
    records and concepts, committed in seq order): the last id shipped. Rows past it are a prefix.
  - "seq" tables (ids from a sequence; two transactions may commit out of order, a tag applied by a
    request while the writer's batch, which took smaller ids for its automatic tags, still commits):
    the last id shipped and the ids below it not seen yet, the open gaps. Each cycle reads the rows
    past the watermark and those in the open gaps; a gap still empty after GAP_TIMEOUT_S is taken for
    ids that were rolled back or deleted before shipping, and closed. The gaps are stored with the
    watermark (lake_watermarks.open_gaps), so a restart goes on checking them.
  - "keyed" tables (tags and concept_hierarchy, updated in place; session_states, whose versions are
    pruned and, after a session is deleted, numbered again): the hash of each row's identity columns
    as last shipped, per key. A count and hash sum over the identity columns spares reading the
    table when nothing changed; else each row whose hash differs goes again as a new version.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from core.errors import Unavailable
from xdb.lake.purge import PURGED, LakePurger, Purge, retried_on_conflict
from xdb.lake.schema import TABLES, LakeTable, redacted, rollback
from xdb.sql import string_literal
from xdb.storage.retention import Tombstone

log = logging.getLogger("ahc.xdb.lake")

LOG_EVERY_S = 60.0  # a failing lake is logged when its error changes, else at most this often
# An open gap (ids below a "seq" table's watermark not seen committed) is rechecked this long: longer
# than any transaction of XDB's (the writer's batch waits at most 60 s for the audit).
GAP_TIMEOUT_S = 300.0
# The shipper's thread runs at this niceness (Linux: per thread): on a busy machine the writer's
# threads, which the server's recording waits on, come first; the lake catches up when they idle.
SHIPPER_NICE = 10
MAX_GAPS = 256     # a table with more open gaps drops its oldest (ids deleted before shipping, most likely)

Gap = tuple[int, int, float]  # first id, last id, monotonic deadline
ApplyTombstone = Callable[[Tombstone], dict[str, int]]  # deletes the local copies; rows deleted per table


class LakeUnavailable(Unavailable):
    """The lake could not be written (or read) now; the local files have everything, and the rows are
    shipped once it is back."""


@dataclass
class _Batch:
    table: LakeTable
    rows: pa.Table
    watermark: int | None = None   # modes id and seq: the new watermark, recorded with `gaps`
    gaps: list[Gap] = field(default_factory=list)
    hashes: dict[tuple[Any, ...], int] | None = None  # mode keyed: every local key's hash once shipped


def _select_list(table: LakeTable) -> str:
    """The local columns as the lake takes them: fixed-size ARRAYs cast to LISTs."""
    return ", ".join(f"CAST({name} AS {kind}) AS {name}" if kind.endswith("[]") else name
                     for name, kind in table.columns)


class LakeShipper:
    """Ships through `lake`, a DuckDB connection of its own with the lake attached (closed by `stop`)."""

    def __init__(self, lake: duckdb.DuckDBPyConnection, alias: str, replica: str,
                 experience: duckdb.DuckDBPyConnection, audit: duckdb.DuckDBPyConnection | None, *,
                 interval_s: float = 0.5, batch_rows: int = 100_000, tombstone_poll_s: float = 2.0,
                 on_tombstone: ApplyTombstone | None = None) -> None:
        self.alias, self.replica = alias, replica
        self.interval_s, self.batch_rows = interval_s, batch_rows
        self.tombstone_poll_s, self.on_tombstone = tombstone_poll_s, on_tombstone
        self._applied: set[tuple[str, int]] | None = None  # other replicas' tombstones applied here
        self._next_poll = 0.0
        self._conn = lake
        self._lake = lake.cursor()
        self.purger = LakePurger(self._lake, alias, replica)
        self._local = experience.cursor()
        self._audit = audit.cursor() if audit is not None else None
        self._lock = threading.Lock()   # one cycle at a time (the thread's, or a caller's ship_now)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.watermarks: dict[str, int] = {}
        self._gaps: dict[str, list[Gap]] = {}
        self._hashes: dict[str, dict[tuple[Any, ...], int]] = {}
        self._fingerprints: dict[str, tuple[Any, ...]] = {}
        self._stale = True              # watermarks to be read from the lake before the next cycle
        self.rows_shipped = 0
        self.ships = 0
        self.last_ship_at: float | None = None
        self.last_error: str | None = None
        self._logged: tuple[str | None, float] = (None, 0.0)

    # -- life -----------------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            self._load()
        self._poll_tombstones()  # deletions made elsewhere while this replica was down, before any read
        self._thread = threading.Thread(target=self._run, name="xdb-lake-shipper", daemon=True)
        self._thread.start()

    def stop(self, final_ship: bool = True) -> None:
        """Stop the thread, then ship what is left (a lake that fails now is logged: the rows stay in
        the local files and go at the next start)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            if final_ship:
                try:
                    self.ship_now()
                except LakeUnavailable:
                    log.error("the last ship to the lake failed; the rows go at the next start: %s", self.last_error)
        finally:
            for cur in (self._lake, self._local, self._audit):
                if cur is not None:
                    cur.close()
            self._conn.close()

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SHIPPER_NICE)
        except (AttributeError, OSError):  # not Linux: the thread keeps the process's priority
            pass
        while not self._stop.wait(self.interval_s):
            more = True
            while more and not self._stop.is_set():
                try:
                    # One transaction at a time, so a caller's ship_now (a State being saved) waits
                    # for one cycle of a backlog, not for all of it.
                    with self._lock:
                        _, more = self._cycle()
                except LakeUnavailable:
                    break  # logged by the cycle; tried again next interval
                except Exception as exc:  # the thread must go on: a bug must not stop shipping for good
                    log.error("lake shipper cycle failed: %s", redacted(f"{type(exc).__name__}: {exc}"))
                    break
            if time.monotonic() >= self._next_poll and not self._stop.is_set():
                self._poll_tombstones()

    def _poll_tombstones(self) -> None:
        self._next_poll = time.monotonic() + self.tombstone_poll_s
        try:
            with self._lock:
                self._follow_tombstones()
        except Exception as exc:  # a lake that is down, or a local write conflict: the next poll
            log.warning("applying other replicas' deletions failed (tried again in %.0f s): %s",
                        self.tombstone_poll_s, redacted(f"{type(exc).__name__}: {exc}"))

    # -- other replicas' deletions -------------------------------------------------------------------
    def follow_tombstones(self) -> int:
        """Apply now every tombstone another replica has shipped and this one has not applied; how many."""
        with self._lock:
            return self._follow_tombstones()

    def _follow_tombstones(self) -> int:
        """Each new tombstone: this replica's copies of the session up to its time are deleted (the
        local rows by `on_tombstone`, then those it shipped to the lake after the tombstone went in)."""
        if self.on_tombstone is None:
            return 0
        if self._applied is None:
            self._applied = {(str(r), int(i)) for r, i in
                             self._local.execute("SELECT replica, id FROM applied_tombstones").fetchall()}
        found = self._lake.execute(f"SELECT replica, id, session_id, deleted_at, reason FROM {self.alias}."
                                   "session_tombstones WHERE replica <> ? ORDER BY deleted_at, replica, id",
                                   [self.replica]).fetchall()
        fresh = [Tombstone(str(r), int(i), str(s), at, str(why)) for r, i, s, at, why in found
                 if (str(r), int(i)) not in self._applied]
        for stone in fresh:
            deleted = self.on_tombstone(stone)
            self.purger.add([Purge(stone.session_id, stone.deleted_at, only_mine=True)])
            self._applied.add((stone.replica, stone.id))
            if deleted:
                log.info("session %r deleted on replica %r: %d row(s) deleted here", stone.session_id,
                         stone.replica, sum(deleted.values()))
        self.purger.run()
        return len(fresh)

    # -- shipping ----------------------------------------------------------------------------------
    def ship_now(self) -> dict[str, int]:
        """Ship everything committed locally so far (several lake transactions for a backlog over
        `batch_rows`), synchronously; returns the rows shipped per table. Raises LakeUnavailable."""
        shipped: dict[str, int] = {}
        with self._lock:
            while True:
                counts, more = self._cycle()
                for name, n in counts.items():
                    shipped[name] = shipped.get(name, 0) + n
                if not more:
                    return shipped

    def reload(self) -> None:
        """Forget what this process knows of the lake's watermarks: the next cycle reads them back, as
        a restart does (after a failed ship this happens by itself)."""
        with self._lock:
            self._stale = True

    def _cycle(self) -> tuple[dict[str, int], bool]:
        try:
            if self._stale:
                self._load()
            batches = self._read_local()
            if batches:
                self._write_lake(batches)
            self.purger.run()
        except Exception as exc:
            self._stale = True  # what the lake holds now is read back before the next try
            self._failed(exc)
            raise LakeUnavailable(f"shipping to the lake failed: {self.last_error}") from exc
        self.last_error = None
        counts = {b.table.name: b.rows.num_rows for b in batches if b.rows.num_rows}
        full = any(b.rows.num_rows >= self.batch_rows for b in batches if b.table.mode != "keyed")
        return counts, full

    def _failed(self, exc: Exception) -> None:
        self.last_error = redacted(" ".join(f"{type(exc).__name__}: {exc}".split()))
        message, at = self._logged
        if message != self.last_error or time.monotonic() - at > LOG_EVERY_S:
            log.error("lake shipper (replica %s): %s", self.replica, self.last_error)
            self._logged = (self.last_error, time.monotonic())

    def _load(self) -> None:
        """Watermarks, open gaps and shipped row hashes as the lake holds them; checks the local files
        are not behind them (a new data dir under a replica id that already shipped would be skipped)."""
        a, cur = self.alias, self._lake
        rows = cur.execute(f"SELECT table_name, arg_max(shipped_to, shipped_at), arg_max(open_gaps, shipped_at) "
                           f"FROM {a}.lake_watermarks WHERE replica = ? GROUP BY 1", [self.replica]).fetchall()
        watermarks = {name: int(to) for name, to, _ in rows}
        purged_to = watermarks.pop(PURGED, 0)
        until = time.monotonic() + GAP_TIMEOUT_S
        gaps = {name: [(int(lo), int(hi), until) for lo, hi in json.loads(found)] for name, _, found in rows if found}
        hashes: dict[str, dict[tuple[Any, ...], int]] = {}
        for table in TABLES:
            if table.mode == "keyed":
                hashes[table.name] = self._shipped_hashes(table)
        self._check_not_behind(watermarks)
        self.purger.load(purged_to)
        self.watermarks, self._gaps, self._hashes, self._fingerprints = watermarks, gaps, hashes, {}
        self._stale = False

    def _shipped_hashes(self, table: LakeTable) -> dict[tuple[Any, ...], int]:
        """The hash last shipped for each key the local table holds now."""
        keys = ", ".join(table.key)
        local = self._local.execute(f"SELECT DISTINCT {keys} FROM {table.name}").to_arrow_table()
        if not local.num_rows:
            return {}
        self._lake.register("xdb_local_keys", local)
        try:
            on = " AND ".join(f"l.{k} = k.{k}" for k in table.key)
            found = self._lake.execute(
                f"SELECT {', '.join('l.' + k for k in table.key)}, arg_max(l.row_hash, l.shipped_at) "
                f"FROM {self.alias}.{table.name} l SEMI JOIN xdb_local_keys k ON {on} WHERE l.replica = ? "
                f"GROUP BY {', '.join('l.' + k for k in table.key)}", [self.replica]).fetchall()
        finally:
            self._lake.unregister("xdb_local_keys")
        return {tuple(r[:-1]): int(r[-1]) for r in found}

    def _check_not_behind(self, watermarks: dict[str, int]) -> None:
        meta = self._local.execute("SELECT value FROM xdb_meta WHERE key = 'last_timestep_id'").fetchone()
        local_id = int(meta[0]) if meta else -1
        if watermarks.get("timesteps", -1) > local_id:
            raise ValueError(f"replica {self.replica!r} has shipped timesteps up to id {watermarks['timesteps']} to "
                             f"the lake, but this data dir has recorded only up to id {local_id}: each data dir "
                             "needs a replica id of its own (a new or restored data dir, a new replica_id)")
        if self._audit is not None:
            seq = self._audit.execute("SELECT max(seq) FROM audit_records").fetchone()
            local_seq = -1 if seq is None or seq[0] is None else int(seq[0])
            if watermarks.get("audit_records", -1) > local_seq:
                raise ValueError(f"replica {self.replica!r} has shipped audit records up to seq "
                                 f"{watermarks['audit_records']} to the lake, but this data dir's audit log ends at "
                                 f"seq {local_seq}: each data dir needs a replica id of its own")

    def _read_local(self) -> list[_Batch]:
        """Every table's unshipped rows, from one snapshot of each file."""
        batches: list[_Batch] = []
        cursors = [c for c in (self._local, self._audit) if c is not None]
        for cur in cursors:
            cur.execute("BEGIN")
        try:
            for table in TABLES:
                source = self._audit if table.audit else self._local
                if source is None:
                    continue
                batch = self._read_table(source, table)
                if batch is not None:
                    batches.append(batch)
        finally:
            for cur in cursors:
                rollback(cur)
        return batches

    def _read_table(self, cur: duckdb.DuckDBPyConnection, table: LakeTable) -> _Batch | None:
        if table.mode == "keyed":
            return self._read_keyed(cur, table)
        n, cols, order = self.batch_rows, _select_list(table), table.order
        # A sequence starts at 1: before anything is shipped, 0 is the watermark (no gap at id 0).
        wm = self.watermarks.get(table.name, -1 if table.mode == "id" else 0)
        if table.mode == "id":
            rows = cur.execute(f"SELECT {cols} FROM {table.name} WHERE {order} > {wm} "
                               f"ORDER BY {order} LIMIT {n}").to_arrow_table()
            return _Batch(table, rows, int(rows.column(order)[-1].as_py())) if rows.num_rows else None
        now = time.monotonic()
        gaps = [g for g in self._gaps.get(table.name, []) if g[2] > now]
        where = " OR ".join([f"{order} > {wm}", *(f"{order} BETWEEN {lo} AND {hi}" for lo, hi, _ in gaps)])
        rows = cur.execute(f"SELECT {cols} FROM {table.name} WHERE {where} ORDER BY {order} "
                           f"LIMIT {n}").to_arrow_table()
        ids = np.asarray(rows.column(order).to_numpy(), dtype=np.int64) if rows.num_rows else np.zeros(0, np.int64)
        new_wm, new_gaps = advance(wm, gaps, ids, now + GAP_TIMEOUT_S)
        if len(new_gaps) > MAX_GAPS:
            log.warning("lake shipper: %s has %d ids below its watermark not seen; dropping the oldest gaps",
                        table.name, len(new_gaps))
            new_gaps = sorted(new_gaps, key=lambda g: g[2])[-MAX_GAPS:]
        new_gaps.sort()
        if rows.num_rows or new_gaps != sorted(self._gaps.get(table.name, [])):
            return _Batch(table, rows, new_wm, new_gaps)
        return None

    def _read_keyed(self, cur: duckdb.DuckDBPyConnection, table: LakeTable) -> _Batch | None:
        """The rows whose identity hash differs from the version last shipped (or that were never
        shipped). A count and hash sum over the identity columns spares reading more when nothing
        changed; then keys and hashes are read, and only the changed rows in full."""
        identity = f"hash({', '.join(table.hashed)})"
        fingerprint = tuple(cur.execute(f"SELECT count(*), CAST(sum({identity}) AS VARCHAR) "
                                        f"FROM {table.name}").fetchone() or ())
        if self._fingerprints.get(table.name) == fingerprint:
            return None
        keys = ", ".join(table.key)
        current = cur.execute(f"SELECT {keys}, {identity} AS row_hash FROM {table.name}").to_arrow_table()
        shipped = self._hashes.get(table.name, {})
        key_columns = [current.column(k).to_pylist() for k in table.key]
        hashes = {tuple(parts): int(h) for *parts, h in zip(*key_columns, current.column("row_hash").to_pylist())}
        changed = [key for key, h in hashes.items() if shipped.get(key) != h]
        self._fingerprints[table.name] = fingerprint  # reset with the rest if the lake write fails
        if not changed:
            self._hashes[table.name] = hashes  # keys deleted locally are forgotten
            return None
        wanted = pa.table({k: pa.array([key[i] for key in changed], current.schema.field(k).type)
                           for i, k in enumerate(table.key)})
        cur.register("xdb_changed", wanted)
        try:
            on = " AND ".join(f"t.{k} = c.{k}" for k in table.key)
            cols = ", ".join(f"CAST(t.{name} AS {kind}) AS {name}" if kind.endswith("[]") else f"t.{name}"
                             for name, kind in table.columns)
            rows = cur.execute(f"SELECT {cols}, hash({', '.join('t.' + c for c in table.hashed)}) AS row_hash "
                               f"FROM {table.name} t SEMI JOIN xdb_changed c ON {on}").to_arrow_table()
        finally:
            cur.unregister("xdb_changed")
        return _Batch(table, rows, hashes=hashes)

    def _write_lake(self, batches: list[_Batch]) -> None:
        retried_on_conflict(lambda: self._commit(batches))
        for b in batches:
            if b.table.name == "session_tombstones":
                self.purger.add([Purge(s, at, only_mine=False, tombstone_id=i) for i, s, at in
                                 zip(*(b.rows.column(c).to_pylist() for c in ("id", "session_id", "deleted_at")))])
            if b.watermark is not None:
                self.watermarks[b.table.name] = b.watermark
                self._gaps[b.table.name] = b.gaps
            if b.hashes is not None:
                self._hashes[b.table.name] = b.hashes
        self.rows_shipped += sum(b.rows.num_rows for b in batches)
        self.ships += 1
        self.last_ship_at = time.time()

    def _commit(self, batches: list[_Batch]) -> None:
        """The batches and their watermarks, in one lake transaction."""
        a, cur, replica = self.alias, self._lake, string_literal(self.replica)
        marks = []
        cur.execute("BEGIN")
        try:
            for b in batches:
                names = ", ".join(b.table.names)
                if b.watermark is not None:
                    gaps = json.dumps([[lo, hi] for lo, hi, _ in b.gaps]) if b.gaps else None
                    marks.append(f"({replica}, '{b.table.name}', {int(b.watermark)}, now(), "
                                 f"{'NULL' if gaps is None else string_literal(gaps)})")
                if not b.rows.num_rows:
                    continue
                cur.register("xdb_ship", b.rows)
                try:
                    if b.table.mode == "keyed":
                        cur.execute(f"INSERT INTO {a}.{b.table.name} (replica, {names}, shipped_at, row_hash) "
                                    f"SELECT {replica}, {names}, now(), row_hash FROM xdb_ship")
                    else:
                        cur.execute(f"INSERT INTO {a}.{b.table.name} (replica, {names}) "
                                    f"SELECT {replica}, {names} FROM xdb_ship")
                    if b.table.name == "timesteps":
                        cur.execute(f"INSERT INTO {a}.session_ticks SELECT {replica}, session_id, max(tick), now() "
                                    "FROM xdb_ship GROUP BY session_id")
                finally:
                    cur.unregister("xdb_ship")
            if marks:
                cur.execute(f"INSERT INTO {a}.lake_watermarks VALUES {', '.join(marks)}")
            cur.execute("COMMIT")
        except BaseException:
            rollback(cur)
            raise

    def status(self) -> dict[str, Any]:
        return {"replica": self.replica, "rows_shipped": self.rows_shipped, "ships": self.ships,
                "last_ship_at": self.last_ship_at, "last_error": self.last_error,
                "watermarks": dict(self.watermarks), "purges_pending": len(self.purger.pending),
                "running": self._thread is not None}


def advance(watermark: int, gaps: list[Gap], ids: np.ndarray, until: float) -> tuple[int, list[Gap]]:
    """A "seq" table's watermark and open gaps once the rows `ids` (sorted, read past the watermark
    and in the gaps) are shipped: the ids skipped past the old watermark open new gaps (deadline
    `until`), and each id found in a gap closes that id."""
    above = ids[ids > watermark]
    found_below = ids[ids <= watermark]
    left: list[Gap] = []
    for lo, hi, deadline in gaps:
        inside = found_below[(found_below >= lo) & (found_below <= hi)]
        start = lo
        for i in inside.tolist():
            if i > start:
                left.append((start, i - 1, deadline))
            start = i + 1
        if start <= hi:
            left.append((start, hi, deadline))
    if above.size:
        run = np.concatenate([[watermark], above])
        for i in np.nonzero(np.diff(run) > 1)[0].tolist():
            left.append((int(run[i]) + 1, int(run[i + 1]) - 1, until))
        watermark = int(above[-1])
    return watermark, left
