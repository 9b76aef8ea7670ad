"""xdb/tables.py is the one description of XDB's tables: every table a migrated data dir holds has an entry,
and export, the lake (its columns and tombstones), retention and the agent's runs all agree with it."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from xdb import XDB, export, runs
from xdb.lake import schema as lake_schema
from xdb.schema import EXPERIENCE_FILE
from xdb.storage import retention
from xdb.store import AUDIT_FILE
from xdb.tables import RUN, SESSION, TABLES

BY_NAME = {t.name: t for t in TABLES}
# Tables that name a session without being its rows: they must outlive its deletion (its tombstones, and
# the audit log, which is append-only).
OUTLIVE_SESSIONS = {"session_tombstones", "applied_tombstones", "audit_records",
                    "segment_sessions"}  # until the erase pass rewrites the segments it names


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    default: str | None


@dataclass(frozen=True)
class DataDir:
    tables: dict[str, tuple[Column, ...]]
    audit: set[str]  # the tables of audit/audit.duckdb
    sequences: set[str]

    def names(self, table: str) -> tuple[str, ...]:
        return tuple(c.name for c in self.tables[table])


def read_file(path: Path) -> tuple[dict[str, tuple[Column, ...]], set[str]]:
    conn = duckdb.connect(str(path), read_only=True)
    try:
        rows = conn.execute("SELECT table_name, column_name, data_type, column_default FROM information_schema.columns "
                            "WHERE table_catalog = current_database() AND table_schema = 'main' "
                            "ORDER BY table_name, ordinal_position").fetchall()
        sequences = {name for (name,) in conn.execute("SELECT sequence_name FROM duckdb_sequences() "
                                                      "WHERE database_name = current_database()").fetchall()}
    finally:
        conn.close()
    tables: dict[str, tuple[Column, ...]] = {}
    for table, column, kind, default in rows:
        tables[table] = (*tables.get(table, ()), Column(column, kind, default))
    return tables, sequences


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    """A data dir as the store creates and migrates it, read back from its files."""
    path = tmp_path_factory.mktemp("xdb")
    XDB.open(path).close()
    experience, sequences = read_file(path / EXPERIENCE_FILE)
    audit, audit_sequences = read_file(path / AUDIT_FILE)
    assert experience and audit and not experience.keys() & audit.keys()
    return DataDir({**experience, **audit}, set(audit), sequences | audit_sequences)


def as_list(kind: str) -> str:
    return re.sub(r"\[\d+\]$", "[]", kind)


def test_every_table_has_one_entry(data_dir: DataDir) -> None:
    assert len(BY_NAME) == len(TABLES)
    # A view's entry covers the table its rows are written to (timesteps: the hot table).
    assert set(data_dir.tables) == set(BY_NAME) | {t.stored_in for t in TABLES if t.stored_in}
    assert all(set(data_dir.names(t.name)) == set(data_dir.names(t.stored_in)) for t in TABLES if t.stored_in)
    assert {t.name for t in TABLES if t.audit} == data_dir.audit


def test_entries_name_columns_the_tables_have(data_dir: DataDir) -> None:
    for t in TABLES:
        named = [t.session_column, t.time_column, t.activity_column, t.id_column, t.sequence_column]
        if t.lake is not None:
            named += [*t.lake.key, *t.lake.identity] if t.lake.mode == "keyed" else [t.lake.order]
        assert {c for c in named if c is not None} <= set(data_dir.names(t.name)), t.name
        types = {c.name: c.type for c in data_dir.tables[t.name]}
        for column in (t.time_column, t.activity_column):
            assert column is None or types[column] == "TIMESTAMP", (t.name, column)


def test_owner_columns(data_dir: DataDir) -> None:
    """A table holding a session's (a run's) id is deleted with it, unless it must outlive it."""
    for name, columns in data_dir.tables.items():
        have = {c.name for c in columns}
        entry = BY_NAME.get(name)
        if entry is None:
            continue  # test_every_table_has_one_entry names it
        if SESSION in have and name not in OUTLIVE_SESSIONS:
            assert entry.session_column == SESSION, name
        elif RUN in have:
            assert entry.session_column == RUN, name
        else:
            assert entry.session_column is None, name


def test_sequences(data_dir: DataDir) -> None:
    """Every sequence is known (import moves it past the ids it loads) and backs its id column."""
    assert {t.sequence for t in TABLES if t.sequence is not None} == data_dir.sequences
    for t in TABLES:
        if t.sequence is not None:
            defaults = {c.name: c.default for c in data_dir.tables[t.name]}
            assert t.sequence_column is not None and defaults[t.sequence_column] == f"nextval('{t.sequence}')"


def test_export(data_dir: DataDir) -> None:
    assert export.TABLES == tuple(t for t in TABLES if t.export)
    exported = {t.name for t in export.TABLES}
    # Only the file's bookkeeping, the tombstones and the audit log stay out of an export.
    assert set(data_dir.tables) - exported == {"xdb_meta", "segments", "segment_deletes", "segment_sessions",
                                               "session_tombstones", "applied_tombstones", "timesteps_hot",
                                               *data_dir.audit}


def test_lake_columns_are_the_local_tables(data_dir: DataDir) -> None:
    shipped = [t for t in TABLES if t.lake is not None]
    assert [t.name for t in lake_schema.TABLES] == [t.name for t in shipped]
    for table in lake_schema.TABLES:
        entry = BY_NAME[table.name]
        assert entry.lake is not None and table.audit == entry.audit
        assert (table.mode, table.order, table.key, table.identity) == (
            entry.lake.mode, entry.lake.order, entry.lake.key, entry.lake.identity)
        local = data_dir.tables[table.name]
        assert table.columns == tuple((c.name, as_list(c.type)) for c in local)
        assert not any(re.search(r"\[\d+\]", kind) for _, kind in table.columns), table.name
    timesteps = next(t for t in lake_schema.TABLES if t.name == "timesteps")
    assert dict(timesteps.columns)["concept_ids"] == "INTEGER[]"  # a fixed-size ARRAY, as a LIST


def test_lake_ddl_makes_the_local_columns(data_dir: DataDir) -> None:
    """The lake's DDL, run on a plain DuckDB database (DuckLake takes the same statements), makes each
    table as `replica` + the local columns (+ the version columns of a keyed table)."""
    conn = duckdb.connect()
    try:
        conn.execute("ATTACH ':memory:' AS lake")
        for ddl in lake_schema.lake_ddl("lake"):
            conn.execute(ddl)
        for table in lake_schema.TABLES:
            made = [(r[0], r[1]) for r in conn.execute(f"DESCRIBE lake.{table.name}").fetchall()]
            extra = [("shipped_at", "TIMESTAMP"), ("row_hash", "UBIGINT")] if table.mode == "keyed" else []
            local = [(c.name, as_list(c.type)) for c in data_dir.tables[table.name]]
            assert made == [("replica", "VARCHAR"), *local, *extra], table.name
    finally:
        conn.close()


def test_tombstones_follow_every_shipped_session_table(data_dir: DataDir) -> None:
    """A deleted session's rows must not come back from the lake: every shipped table of a session's
    rows is tombstoned, dated by a column the lake has, and the tombstones ship after them (the lake's
    deletion then takes the rows of the same ship)."""
    expected = [(t.name, t.time_column) for t in TABLES if t.lake is not None and t.session_column == SESSION]
    assert expected and list(lake_schema.TOMBSTONED) == expected
    assert all(t.tombstoned for t in TABLES if t.name in dict(lake_schema.TOMBSTONED))
    shipped = [t.name for t in lake_schema.TABLES]
    for name, column in lake_schema.TOMBSTONED:
        assert column in data_dir.names(name)
        assert shipped.index(name) < shipped.index("session_tombstones"), name


def test_retention(data_dir: DataDir) -> None:
    owned = [t for t in TABLES if t.session_column == SESSION]
    assert set(retention.SESSION_TABLES) == {t.name for t in owned} and len(retention.SESSION_TABLES) == len(owned)
    assert retention.SESSION_TABLES[-1] == "session_ticks"  # the order a deletion has always reported
    assert retention.DATED == tuple((t.name, t.time_column) for t in owned if t.time_column is not None)
    assert "session_ticks" not in dict(retention.DATED)  # the tick counter outlives another replica's tombstone
    assert retention.ACTIVITY == tuple((t.name, t.activity_column) for t in owned if t.activity_column is not None)
    assert {"timesteps", "session_states"} <= set(dict(retention.ACTIVITY))  # a token, a saved State
    for name, column in retention.ACTIVITY:
        assert f"SELECT session_id, {column} AS seen FROM {name} " in retention.EXPIRED


def test_runs(data_dir: DataDir) -> None:
    assert runs.RUN_TABLES == tuple(t.name for t in TABLES if t.session_column == RUN)
    assert runs.KEYS == {t.name: t.sequence_column for t in TABLES if t.session_column == RUN}
    for name, key in runs.KEYS.items():
        assert key in data_dir.names(name)


@pytest.mark.process
@pytest.mark.parametrize("opener", ["xdb.schema:open_experience", "xdb.audit.log:AuditLog.open"])
def test_a_file_killed_right_after_its_migrations_opens_again(tmp_path: Path, opener: str) -> None:
    """A process killed before DuckDB's first checkpoint leaves the migrations in the WAL; DuckDB 1.5.5 cannot
    replay one that adds a column to a table keyed by a sequence, so the migrations are checkpointed at once."""
    module, name = opener.split(":")
    path = tmp_path / "f.duckdb"
    script = (f"import os, importlib, pathlib, operator\n"
              f"opener = operator.attrgetter({name!r})(importlib.import_module({module!r}))\n"
              f"opener(pathlib.Path({str(path)!r}))\n"
              "os._exit(0)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    conn = duckdb.connect(str(path))  # raised "Failure while replaying WAL file" before
    assert conn.execute("SELECT count(*) FROM duckdb_tables()").fetchone()[0] > 0
    conn.close()
