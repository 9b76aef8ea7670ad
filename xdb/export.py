"""Exports of the experience database: every table's rows as Parquet (or JSON lines) files, partitioned
by session, with a manifest — row counts, each file's SHA-256, the audit head at export time — and the
way back in: `import_export` loads an export into an empty XDB, so recall over the copy answers as the
original did.

Files are laid out `<table>/session_id=<url-quoted id>/data_0.parquet` (Hive partitioning, which
DuckDB, Spark, pandas and polars read as is); tables without a session (the concept vocabulary, tags,
documents) are one file each. An id whose quoted form would not fit a file name (255 bytes: a long id in
a non-Latin script) is partitioned under a stand-in, `sha256-<digest>`, which the manifest's
`long_ids` maps back to the id and import restores. Sequence-backed ids are kept, and the sequences
moved past them on import.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import urllib.parse
import uuid
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Literal

import duckdb

from core.errors import InvalidRequest
from xdb.audit.log import AuditEvent
from xdb.interface import writes
from xdb.owner import owned
from xdb.private import private_dir, private_files, private_tree
from xdb.sql import string_literal
from xdb.tables import TABLES as XDB_TABLES
from xdb.tables import Table

Format = Literal["parquet", "jsonl"]
MANIFEST = "manifest.json"
EXPORT_VERSION = 1
TABLES: tuple[Table, ...] = tuple(t for t in XDB_TABLES if t.export)


@dataclass(frozen=True)
class ExportFilter:
    session_id: str | None = None  # one session (a run, for the discovery agent's tables)
    since: dt.datetime | None = None  # rows created at or after this (UTC)
    _: KW_ONLY
    owner: str  # one tenant's sessions and documents (xdb/owner.py; EVERY: every tenant's)

    def where(self, table: Table) -> tuple[str, list[Any]]:
        clauses: list[str] = ["TRUE"]
        params: list[Any] = []
        key = table.session_column or table.id_column
        if key is not None and self.owner:
            condition, owner_params = owned(key, self.owner)
            clauses.append(condition)
            params += owner_params
        if self.session_id is not None and table.session_column is not None:
            clauses.append(f"{table.session_column} = ?")
            params.append(self.session_id)
        if self.since is not None and table.time_column is not None:
            clauses.append(f"{table.time_column} >= ?")
            params.append(self.since.replace(tzinfo=None))
        return " AND ".join(clauses), params


@dataclass
class ExportResult:
    id: str
    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)


@writes
def note_engine(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, label: str) -> None:
    """Remember that an engine so labelled (an emulated one, "emulated:PROFILE") recorded rows here:
    every export made from now on says so in its manifest (`engines`)."""
    known = set(recorded_engines(cur))
    if label not in known:
        cur.execute("INSERT OR REPLACE INTO xdb_meta VALUES ('engines', ?)", [json.dumps(sorted({*known, label}))])


def recorded_engines(cur: duckdb.DuckDBPyConnection) -> list[str]:
    row = cur.execute("SELECT value FROM xdb_meta WHERE key = 'engines'").fetchone()
    return list(json.loads(row[0])) if row else []


def export_rows(conn: duckdb.DuckDBPyConnection, out: Path, fmt: Format, filters: ExportFilter,
                audit_head: tuple[int, str], export_id: str | None = None) -> ExportResult:
    """Write every table's rows matching `filters` under `out` (a new or empty directory) and the
    manifest last, so a directory with a manifest is a complete export. One read transaction: the
    tables are consistent with each other as of one moment."""
    if fmt not in ("parquet", "jsonl"):
        raise InvalidRequest(f"format must be parquet or jsonl, not {fmt!r}", param="format")
    if out.exists() and any(out.iterdir()):
        raise InvalidRequest(f"export destination {out} is not empty", param="out")
    private_dir(out)
    tables: dict[str, Any] = {}
    long_ids: dict[str, str] = {}
    conn.execute("BEGIN TRANSACTION")
    try:
        for table in TABLES:
            tables[table.name] = _export_table(conn, out, fmt, table, filters, long_ids)
    finally:
        conn.execute("ROLLBACK")
    manifest = {
        "export_version": EXPORT_VERSION, "id": export_id or f"exp-{uuid.uuid4().hex[:12]}",
        "created_at": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"), "format": fmt,
        "prefix": filters.owner,  # the owner: the key stored manifests hold it under
        "filters": {"session_id": filters.session_id,
                    "since": filters.since.isoformat() if filters.since is not None else None},
        "audit_head": {"seq": audit_head[0], "hash": audit_head[1]},
        "rows": sum(t["rows"] for t in tables.values()), "tables": tables,
        **({"engines": engines} if (engines := recorded_engines(conn)) else {}),
        **({"long_ids": long_ids} if long_ids else {}),
    }
    private_tree(out)  # what DuckDB's COPY wrote, under the process's umask
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    private_files(out / MANIFEST)
    return ExportResult(manifest["id"], out, manifest)


# A partition directory is named `<column>=<url-quoted value>`, and a file name holds at most 255 bytes.
NAME_MAX = 255


def _stand_in(value: str) -> str:
    return "sha256-" + hashlib.sha256(value.encode()).hexdigest()


def _long_values(conn: duckdb.DuckDBPyConnection, table: Table, where: str, params: list[Any]) -> list[str]:
    """The partition values of `table` whose directory name would be too long for the filesystem."""
    column = table.session_column
    rows = conn.execute(f"SELECT DISTINCT {column} FROM {table.name} WHERE {where} AND strlen({column}) * 3 + "
                        f"{len(column or '') + 1} > {NAME_MAX}", params).fetchall()
    return [v for (v,) in rows if len(f"{column}={urllib.parse.quote(v, safe='')}".encode()) > NAME_MAX]


def _export_table(conn: duckdb.DuckDBPyConnection, out: Path, fmt: Format, table: Table,
                  filters: ExportFilter, long_ids: dict[str, str]) -> dict[str, Any]:
    where, params = filters.where(table)
    order = table.sequence_column or ("id" if table.name == "timesteps" else None)
    columns = "*"
    if table.session_column is not None and (long := _long_values(conn, table, where, params)):
        keys = {_stand_in(v): v for v in long}
        long_ids.update(keys)
        cases = " ".join("WHEN ? THEN ?" for _ in keys)
        columns = f"* REPLACE (CASE {table.session_column} {cases} ELSE {table.session_column} END " \
                  f"AS {table.session_column})"
        query_params = [x for key, value in keys.items() for x in (value, key)] + params
    else:
        query_params = params
    query = f"SELECT {columns} FROM {table.name} WHERE {where}" + (f" ORDER BY {order}" if order else "")
    count = conn.execute(f"SELECT count(*) FROM {table.name} WHERE {where}", params).fetchone()
    rows = int(count[0]) if count else 0
    files: list[dict[str, Any]] = []
    if rows:
        target = out / table.name
        if fmt == "parquet" and table.session_column is not None:
            conn.execute(f"COPY ({query}) TO {string_literal(str(target))} (FORMAT parquet, PARTITION_BY "
                         f"({table.session_column}), FILENAME_PATTERN 'data_{{i}}')", query_params)
        elif fmt == "parquet":
            target.mkdir()
            conn.execute(f"COPY ({query}) TO {string_literal(str(target / 'data_0.parquet'))} (FORMAT parquet)",
                         query_params)
        else:
            _export_jsonl(conn, target, table, query, query_params)
        files = [_file_entry(out, path) for path in sorted(target.rglob("*")) if path.is_file()]
    return {"rows": rows, "files": files, "partitioned_by": table.session_column}


def _export_jsonl(conn: duckdb.DuckDBPyConnection, target: Path, table: Table, query: str,
                  params: list[Any]) -> None:
    """JSON lines with the Parquet layout (DuckDB partitions only Parquet and CSV writes)."""
    if table.session_column is None:
        target.mkdir()
        conn.execute(f"COPY ({query}) TO {string_literal(str(target / 'data_0.jsonl'))} (FORMAT json)", params)
        return
    column = table.session_column
    keys = conn.execute(f"SELECT DISTINCT {column} FROM ({query}) ORDER BY 1", params).fetchall()
    for (key,) in keys:
        part = target / f"{column}={urllib.parse.quote(key, safe='')}"
        part.mkdir(parents=True)
        conn.execute(f"COPY (SELECT * EXCLUDE ({column}) FROM ({query}) WHERE {column} = ?) "
                     f"TO {string_literal(str(part / 'data_0.jsonl'))} (FORMAT json)", [*params, key])


def _file_entry(root: Path, path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def read_manifest(src: Path) -> dict[str, Any]:
    """An export's manifest, with every file checked against its SHA-256."""
    try:
        manifest: dict[str, Any] = json.loads((src / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{src} is not an XDB export (no readable {MANIFEST}: {exc})") from None
    if manifest.get("export_version") != EXPORT_VERSION:
        raise ValueError(f"{src}: unsupported export version {manifest.get('export_version')!r}")
    root = src.resolve()
    for table in manifest["tables"].values():
        for entry in table["files"]:
            path = src / entry["path"]
            if not path.resolve().is_relative_to(root):
                raise ValueError(f"{src}: the manifest names a file outside the export: {entry['path']!r}")
            if not path.is_file() or _file_entry(src, path)["sha256"] != entry["sha256"]:
                raise ValueError(f"{src}: {entry['path']} is missing or does not match its SHA-256 in the manifest")
    return manifest


def import_rows(conn: duckdb.DuckDBPyConnection, src: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Load an export into an XDB whose tables are empty (one transaction): its manifest (every file
    checked against it first) and the rows loaded per table. Only the files the manifest lists are
    read (a file dropped beside them is not), and each table must load the rows the manifest counts."""
    manifest = read_manifest(src)
    busy = [t.name for t in TABLES if conn.execute(f"SELECT count(*) > 0 FROM {t.name}").fetchone() == (True,)]
    if busy:
        raise ValueError(f"the target XDB is not empty ({', '.join(busy)} hold rows); import into a new --data-dir")
    loaded: dict[str, int] = {}
    conn.execute("BEGIN TRANSACTION")
    try:
        for table in TABLES:
            entry = manifest["tables"].get(table.name)
            if not entry or not entry["rows"]:
                continue
            reader = "read_parquet" if manifest["format"] == "parquet" else "read_json"
            files = ", ".join(string_literal(str(src / f["path"])) for f in entry["files"])
            hive = ", hive_partitioning = true, hive_types_autocast = false" if entry["partitioned_by"] else ""
            columns = [r[0] for r in conn.execute(f"DESCRIBE {table.name}").fetchall()]
            inserted = conn.execute(f"INSERT INTO {table.target} BY NAME SELECT {', '.join(columns)} "
                                    f"FROM {reader}([{files}]{hive})").fetchone()
            if inserted is None or inserted[0] != entry["rows"]:
                raise ValueError(f"{src}: {table.name} loaded {inserted[0] if inserted else 0:,} rows where the "
                                 f"manifest counts {entry['rows']:,}; nothing was imported")
            if entry["partitioned_by"] and manifest.get("long_ids"):
                conn.executemany(f"UPDATE {table.target} SET {entry['partitioned_by']} = ? "
                                 f"WHERE {entry['partitioned_by']} = ?",
                                 [[value, key] for key, value in manifest["long_ids"].items()])
            loaded[table.name] = entry["rows"]
            if table.sequence is not None:
                top = conn.execute(f"SELECT coalesce(max({table.sequence_column}), 0) FROM {table.name}").fetchone()
                conn.execute(f"SELECT nextval('{table.sequence}') FROM range(?)", [int(top[0]) if top else 0])
        # The writer numbers new rows from here (it keeps the last id rather than scanning for it).
        conn.execute("INSERT OR REPLACE INTO xdb_meta SELECT 'last_timestep_id', max(id)::VARCHAR FROM timesteps "
                     "HAVING count(*) > 0")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return manifest, loaded


def export_bytes(manifest: dict[str, Any]) -> int:
    """The bytes an export's files hold, as its manifest lists them."""
    return sum(f["bytes"] for table in manifest["tables"].values() for f in table["files"])


def created_at(manifest: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(manifest["created_at"].replace("Z", "+00:00"))
