"""The shared lake's tables, and attaching it: DuckDB's `ducklake` extension with its catalog in PostgreSQL.

Every table mirrors a local append-only table (or the audit log's) with a `replica` column first: the
replica that recorded the row. DuckLake has no primary keys, indexes or sequences, so a row's key is
(replica, its local id). Fixed-size ARRAY columns become LISTs (DuckLake has no ARRAY type).
The tables shipped by key (`tags` and `concept_hierarchy`, whose rows change in place, and
`session_states`) get a new row per change, with `shipped_at` ordering a key's versions and
`row_hash` naming the version; `lake_watermarks` (append-only: one row per table a ship moved on)
says how far each replica's tables are shipped, with the ids still open below that (`open_gaps`);
`session_ticks` holds each session's last tick as of each ship that carried its rows, so ticks
continue across replicas. `session_tombstones` are the sessions each replica deleted (by request or
retention): every lake read leaves out the rows of the session up to the tombstone's time from the
commit that ships it, the replica that shipped it deletes them from the lake just after, and every
other replica deletes its own copies (see LakeShipper and LakePurger).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from core.config import cache_dir
from xdb.audit.log import APP as AUDIT_APP
from xdb.audit.log import AUDIT_MIGRATIONS
from xdb.schema import APP, MIGRATIONS, migrate
from xdb.sql import string_literal
from xdb.tables import TABLES as XDB_TABLES
from xdb.tables import LakeShipping, Table


@dataclass(frozen=True, kw_only=True)
class LakeTable(LakeShipping):
    """A table the lake holds: a local table's rows with the replica that recorded them."""

    name: str
    audit: bool = False                   # in audit/audit.duckdb, not experience.duckdb

    @property
    def columns(self) -> tuple[tuple[str, str], ...]:
        """(column, lake type), as the local table names them."""
        return lake_columns()[self.name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)

    @property
    def hashed(self) -> tuple[str, ...]:
        return self.identity or self.names


def _lake_table(table: Table, lake: LakeShipping) -> LakeTable:
    return LakeTable(lake.mode, lake.order, lake.key, lake.identity, name=table.name, audit=table.audit)


TABLES: tuple[LakeTable, ...] = tuple(_lake_table(t, t.lake) for t in XDB_TABLES if t.lake is not None)
# The lake tables that hold a session's content, with the column that dates a row: a tombstone removes
# the rows of its session up to its time from each (session_ticks stay, so ticks continue past a deletion).
TOMBSTONED: tuple[tuple[str, str], ...] = tuple((t.name, t.time_column) for t in XDB_TABLES
                                                if t.tombstoned and t.time_column is not None)


_ARRAY = re.compile(r"\[\d+\]$")  # DuckLake has no fixed-size ARRAY type


@functools.cache
def lake_columns() -> dict[str, tuple[tuple[str, str], ...]]:
    """Every local table's columns with their lake types, read from a freshly migrated file of each kind
    (once per process), so the lake can never drift from the DDL. Fixed-size ARRAYs become LISTs."""
    columns: dict[str, tuple[tuple[str, str], ...]] = {}
    for migrations, meta, app in ((MIGRATIONS, "xdb_meta", APP), (AUDIT_MIGRATIONS, "audit_meta", AUDIT_APP)):
        conn = duckdb.connect()
        try:
            migrate(conn, Path(":memory:"), migrations, meta, app)
            rows = conn.execute("SELECT table_name, column_name, data_type FROM information_schema.columns "
                                "WHERE table_catalog = current_database() AND table_schema = 'main' "
                                "ORDER BY table_name, ordinal_position").fetchall()
        finally:
            conn.close()
        for table, column, kind in rows:
            columns[table] = (*columns.get(table, ()), (column, _ARRAY.sub("[]", kind)))
    return columns


# Tables of the lake's own.
EXTRA_DDL = (
    "CREATE TABLE IF NOT EXISTS {a}.lake_watermarks (replica VARCHAR, table_name VARCHAR, shipped_to BIGINT, "
    "shipped_at TIMESTAMP, open_gaps VARCHAR)",
    "CREATE TABLE IF NOT EXISTS {a}.session_ticks (replica VARCHAR, session_id VARCHAR, last_tick BIGINT, "
    "shipped_at TIMESTAMP)",
)
# Up to this many rows an insert is kept in the catalog itself rather than as a Parquet file of its
# own: the small per-ship inserts (watermarks, States, tags) then make no files.
INLINING_ROW_LIMIT = 100
CREATE_ATTEMPTS = 10


def lake_ddl(alias: str) -> list[str]:
    statements = []
    for table in TABLES:
        extra = ", shipped_at TIMESTAMP, row_hash UBIGINT" if table.mode == "keyed" else ""
        cols = ", ".join(f"{name} {kind}" for name, kind in table.columns)
        statements.append(f"CREATE TABLE IF NOT EXISTS {alias}.{table.name} (replica VARCHAR, {cols}{extra})")
    return statements + [ddl.format(a=alias) for ddl in EXTRA_DDL]


def lake_upgrades(conn: duckdb.DuckDBPyConnection, alias: str) -> list[str]:
    """The columns a lake made by an earlier AHC lacks (a local table gained them since), as ALTERs: a
    replica of this version ships them, and every replica reads them (older rows hold nulls there)."""
    have: dict[str, set[str]] = {}
    for table, column in conn.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ?",
                                      [alias]).fetchall():
        have.setdefault(table, set()).add(column)
    return [f"ALTER TABLE {alias}.{table.name} ADD COLUMN {name} {kind}"
            for table in TABLES if table.name in have
            for name, kind in table.columns if name not in have[table.name]]


# -- the extensions ---------------------------------------------------------------------------------
def extension_file(package: str, name: str) -> Path:
    """The extension binary a `duckdb-extension-<package>` wheel carries for this DuckDB release."""
    module = importlib.import_module(f"duckdb_extension_{package}")
    root = Path(module.__path__[0]) / "extensions"
    wanted = root / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if wanted.is_file():
        return wanted
    found = sorted(p.parent.name for p in root.glob(f"v*/{name}.duckdb_extension"))
    raise RuntimeError(f"duckdb-extension-{package} has {found} but DuckDB is v{duckdb.__version__}: "
                       f"install duckdb-extension-{package}=={duckdb.__version__}")


def postgres_extension() -> Path:
    """The postgres extension loads only under its internal name, `postgres_scanner`: a copy of the
    wheel's binary under that name in the cache directory (made once per DuckDB release)."""
    source = extension_file("postgres", "postgres")
    target = cache_dir() / "duckdb-extensions" / f"v{duckdb.__version__}" / "postgres_scanner.duckdb_extension"
    if not target.is_file() or target.stat().st_size != source.stat().st_size:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
        os.close(fd)
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)  # another process copying at the same time leaves the same bytes
    return target


def load_extensions(conn: duckdb.DuckDBPyConnection) -> None:
    """LOAD ducklake and postgres by path from their PyPI wheels (no network: never INSTALL)."""
    conn.execute(f"LOAD {string_literal(str(extension_file('ducklake', 'ducklake')))}")
    conn.execute(f"LOAD {string_literal(str(postgres_extension()))}")


_PASSWORDS = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)|(://[^:/@\s]+:)[^@\s]+(@)", re.IGNORECASE)


def redacted(text: str) -> str:
    """`text` with the password of any PostgreSQL connection string in it (`password=…`, or the
    `postgresql://user:…@host` form) replaced by `***`: what may be logged or shown."""
    return _PASSWORDS.sub(lambda m: f"{m.group(1)}***" if m.group(1) else f"{m.group(3)}***{m.group(4)}", text)


def attach_lake(conn: duckdb.DuckDBPyConnection, catalog: str, data_path: str | Path | None = None,
                alias: str = "lake", *, read_only: bool = False) -> None:
    """Load the extensions, ATTACH 'ducklake:postgres:<catalog>' AS <alias> (DATA_PATH ...) and create
    the lake's tables where missing. Several replicas may do this at once: a creation that loses the
    race is retried (it then finds the tables made). `read_only` attaches an existing lake as it is
    (its data path is the one its catalog names; `data_path` may be None). A catalog that cannot be
    reached, or a data path other than the catalog's, raises ValueError."""
    if not alias.isidentifier():
        raise ValueError(f"lake alias {alias!r} is not an identifier")
    if data_path is None and not read_only:
        raise ValueError("attaching a lake for writing needs its data path")
    load_extensions(conn)
    options = [f"DATA_INLINING_ROW_LIMIT {INLINING_ROW_LIMIT}"]
    where = ""
    if data_path is not None:
        data_dir = Path(data_path).expanduser().resolve()
        if not read_only:
            data_dir.mkdir(parents=True, exist_ok=True)
            if data_dir.stat().st_uid == os.geteuid():
                data_dir.chmod(0o700)  # the lake's Parquet files are every replica's records: nobody else's
        options.insert(0, f"DATA_PATH {string_literal(str(data_dir) + os.sep)}")
        where = f" (data path {data_dir})"
    if read_only:
        options.append("READ_ONLY")
    attach = f"ATTACH {string_literal('ducklake:postgres:' + catalog)} AS {alias} ({', '.join(options)})"
    for attempt in range(CREATE_ATTEMPTS):
        try:
            conn.execute(attach)
            break
        except duckdb.Error as exc:
            detail = " ".join(str(exc).split())
            # Replicas attaching a new catalog at once race to initialise it; the losers find it made.
            if ("duplicate key" in detail or "already exists" in detail) and attempt < CREATE_ATTEMPTS - 1:
                time.sleep(0.05 * (attempt + 1))
                continue
            raise ValueError(redacted(f"cannot attach the DuckLake catalog {catalog!r}{where}: {detail}")) from exc
    if not read_only:
        create_tables(conn, alias)


def create_tables(conn: duckdb.DuckDBPyConnection, alias: str = "lake") -> None:
    for attempt in range(CREATE_ATTEMPTS):
        conn.execute("BEGIN")
        try:
            for ddl in lake_ddl(alias):
                conn.execute(ddl)
            for ddl in lake_upgrades(conn, alias):
                conn.execute(ddl)
            conn.execute("COMMIT")
            return
        except duckdb.TransactionException:
            # Another replica created a table first: its commit won; look again.
            rollback(conn)
            if attempt == CREATE_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
        except BaseException:
            rollback(conn)
            raise


def rollback(conn: duckdb.DuckDBPyConnection) -> None:
    """End a transaction that failed; a COMMIT that failed has ended it already."""
    try:
        conn.execute("ROLLBACK")
    except duckdb.Error:
        pass
