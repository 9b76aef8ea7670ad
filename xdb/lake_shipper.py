"""The lake shipper: a thread that copies what a replica has committed locally into the shared lake.

Every `interval_s` (and on `ship_now()`) one cycle:
  1. reads, in one snapshot of each local file (a read transaction on the shipper's own cursors of the
     experience connection and of the audit log's), every table's rows past its watermark — at most
     `batch_rows` a table — as Arrow tables;
  2. inserts them all into the lake, with the advanced watermarks, in ONE lake transaction.
So the lake holds a table's rows exactly up to its watermark: a crash before the lake's commit ships
nothing (the next cycle reads the same rows again), one after it has shipped them and their watermark
together. A commit whose outcome is unknown (the catalog went away during COMMIT) makes the next cycle
read the watermarks back from the lake first. The writer is never waited on: the shipper only reads
committed rows, through cursors of its own.

Watermarks (see xdb/lake_schema.py for each table's mode): an id committed in id order (timesteps and
concepts, from the one writer thread; audit records and concepts, committed in seq order), the rowid
of a table with a primary key (DuckDB appends a transaction's rows at commit, so rowids follow commit
order even when a sequence's ids do not, and never renumbers the rows of a table with an index), and
for the two tables updated in place (tags, concept_hierarchy) each row's hash: a row whose hash differs
from the one last shipped goes again as a new version.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from ahc.errors import Unavailable
from xdb.lake_schema import TABLES, LakeTable, rollback

log = logging.getLogger("ahc.xdb.lake")

LOG_EVERY_S = 60.0  # a failing lake is logged when its error changes, else at most this often


class LakeUnavailable(Unavailable):
    """The lake could not be written (or read) now; the local files have everything, and the rows are
    shipped once it is back."""


@dataclass
class _Batch:
    table: LakeTable
    rows: pa.Table
    watermark: int | None = None                 # modes id / rowid: the new watermark
    hashes: dict[tuple[Any, ...], int] = field(default_factory=dict)  # mode mutable: key -> hash shipped


def _select_list(table: LakeTable) -> str:
    """The local columns as the lake takes them: fixed-size ARRAYs cast to LISTs."""
    return ", ".join(f"CAST({name} AS {kind}) AS {name}" if kind.endswith("[]") else name
                     for name, kind in table.columns)


class LakeShipper:
    def __init__(self, lake: duckdb.DuckDBPyConnection, alias: str, replica: str,
                 experience: duckdb.DuckDBPyConnection, audit: duckdb.DuckDBPyConnection | None, *,
                 interval_s: float = 0.5, batch_rows: int = 100_000) -> None:
        self.alias, self.replica = alias, replica
        self.interval_s, self.batch_rows = interval_s, batch_rows
        self._lake = lake.cursor()
        self._local = experience.cursor()
        self._audit = audit.cursor() if audit is not None else None
        self._lock = threading.Lock()   # one cycle at a time (the thread's, or a caller's ship_now)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.watermarks: dict[str, int] = {}
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

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.ship_now()
            except LakeUnavailable:
                pass  # logged by the cycle; tried again next interval
            except Exception:  # the thread must go on: a bug here must not stop shipping for good
                log.exception("lake shipper cycle failed")

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

    def _cycle(self) -> tuple[dict[str, int], bool]:
        try:
            if self._stale:
                self._load()
            batches = self._read_local()
            if batches:
                self._write_lake(batches)
        except Exception as exc:
            self._stale = True  # what the lake holds now is read back before the next try
            self._failed(exc)
            raise LakeUnavailable(f"shipping to the lake failed: {self.last_error}") from exc
        self.last_error = None
        counts = {b.table.name: b.rows.num_rows for b in batches if b.rows.num_rows}
        full = any(b.rows.num_rows >= self.batch_rows for b in batches if b.table.mode != "mutable")
        return counts, full

    def _failed(self, exc: Exception) -> None:
        self.last_error = " ".join(f"{type(exc).__name__}: {exc}".split())
        message, at = self._logged
        if message != self.last_error or time.monotonic() - at > LOG_EVERY_S:
            log.error("lake shipper (replica %s): %s", self.replica, self.last_error)
            self._logged = (self.last_error, time.monotonic())

    def _load(self) -> None:
        """Watermarks and shipped row hashes as the lake holds them; checks the local files are not
        behind them (a new data dir under a replica id that already shipped would be skipped)."""
        a, cur = self.alias, self._lake
        rows = cur.execute(f"SELECT table_name, max(shipped_to) FROM {a}.lake_watermarks WHERE replica = ? "
                           "GROUP BY 1", [self.replica]).fetchall()
        watermarks = {name: int(to) for name, to in rows}
        hashes: dict[str, dict[tuple[Any, ...], int]] = {}
        for table in TABLES:
            if table.mode == "mutable":
                keys = ", ".join(table.key)
                found = cur.execute(f"SELECT {keys}, arg_max(row_hash, shipped_at) FROM {a}.{table.name} "
                                    f"WHERE replica = ? GROUP BY {keys}", [self.replica]).fetchall()
                hashes[table.name] = {tuple(r[:-1]): int(r[-1]) for r in found}
        self._check_not_behind(watermarks)
        self.watermarks, self._hashes, self._fingerprints = watermarks, hashes, {}
        self._stale = False

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
        n, cols = self.batch_rows, _select_list(table)
        if table.mode == "id":
            wm = self.watermarks.get(table.name, -1)
            rows = cur.execute(f"SELECT {cols} FROM {table.name} WHERE {table.order} > {wm} "
                               f"ORDER BY {table.order} LIMIT {n}").to_arrow_table()
            if not rows.num_rows:
                return None
            return _Batch(table, rows, int(rows.column(table.order)[-1].as_py()))
        if table.mode == "rowid":
            wm = self.watermarks.get(table.name, -1)
            rows = cur.execute(f"SELECT rowid AS xdb_rowid, {cols} FROM {table.name} WHERE rowid > {wm} "
                               f"ORDER BY rowid LIMIT {n}").to_arrow_table()
            if not rows.num_rows:
                return None
            last = int(rows.column("xdb_rowid")[-1].as_py())
            return _Batch(table, rows.drop_columns(["xdb_rowid"]), last)
        return self._read_mutable(cur, table)

    def _read_mutable(self, cur: duckdb.DuckDBPyConnection, table: LakeTable) -> _Batch | None:
        """The rows whose hash differs from the version last shipped (or that were never shipped). A
        fingerprint of the whole table (count and hash sum) spares reading it when nothing changed."""
        names = ", ".join(table.names)
        fingerprint = tuple(cur.execute(f"SELECT count(*), CAST(sum(hash({names})) AS VARCHAR) "
                                        f"FROM {table.name}").fetchone() or ())
        if self._fingerprints.get(table.name) == fingerprint:
            return None
        rows = cur.execute(f"SELECT {_select_list(table)}, hash({names}) AS row_hash "
                           f"FROM {table.name}").to_arrow_table()
        shipped = self._hashes.get(table.name, {})
        keys = list(zip(*(rows.column(k).to_pylist() for k in table.key)))
        hashes = rows.column("row_hash").to_pylist()
        changed = [shipped.get(key) != h for key, h in zip(keys, hashes)]
        new = {key: int(h) for key, h, c in zip(keys, hashes, changed) if c}
        self._fingerprints[table.name] = fingerprint  # stale too if the lake write fails (reset by _load)
        if not new:
            return None
        return _Batch(table, rows.filter(pa.array(changed)), hashes=new)

    def _write_lake(self, batches: list[_Batch]) -> None:
        a, cur, replica = self.alias, self._lake, self.replica.replace("'", "''")
        marks = []
        cur.execute("BEGIN")
        try:
            for b in batches:
                names = ", ".join(b.table.names)
                cur.register("xdb_ship", b.rows)
                try:
                    if b.table.mode == "mutable":
                        cur.execute(f"INSERT INTO {a}.{b.table.name} (replica, {names}, shipped_at, row_hash) "
                                    f"SELECT '{replica}', {names}, now(), row_hash FROM xdb_ship")
                    else:
                        cur.execute(f"INSERT INTO {a}.{b.table.name} (replica, {names}) "
                                    f"SELECT '{replica}', {names} FROM xdb_ship")
                    if b.table.name == "timesteps":
                        cur.execute(f"INSERT INTO {a}.session_ticks SELECT '{replica}', session_id, max(tick), now() "
                                    "FROM xdb_ship GROUP BY session_id")
                finally:
                    cur.unregister("xdb_ship")
                if b.watermark is not None:
                    marks.append(f"('{replica}', '{b.table.name}', {int(b.watermark)}, now())")
            if marks:
                cur.execute(f"INSERT INTO {a}.lake_watermarks VALUES {', '.join(marks)}")
            cur.execute("COMMIT")
        except BaseException:
            rollback(cur)
            raise
        for b in batches:
            if b.watermark is not None:
                self.watermarks[b.table.name] = b.watermark
            if b.hashes:
                self._hashes.setdefault(b.table.name, {}).update(b.hashes)
        self.rows_shipped += sum(b.rows.num_rows for b in batches)
        self.ships += 1
        self.last_ship_at = time.time()

    def status(self) -> dict[str, Any]:
        return {"replica": self.replica, "rows_shipped": self.rows_shipped, "ships": self.ships,
                "last_ship_at": self.last_ship_at, "last_error": self.last_error,
                "watermarks": dict(self.watermarks), "running": self._thread is not None}
