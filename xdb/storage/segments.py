"""Sealed segments: a history of any size whose deletions rewrite only the files holding the deleted rows.

Every new timestep goes into `timesteps_hot` in experience.duckdb (one transaction a writer batch). The
storage pass seals what that table holds, once it holds `xdb.segment_rows`, into a segment: a DuckDB file
of its own under DATA_DIR/segments/ holding one table, `timesteps`, of an id range in id order, written
once and never changed, attached read-only (its alias named by the file) and listed in `segments`. Every
read goes through the view `timesteps`: the hot table and the segments, less the segment rows listed in
`segment_deletes` (the view leaves that join out while none is). A segment is DuckDB's own storage, not
Parquet: its zone maps skip the row groups outside recall's id windows (xdb/recall/recall.py) as the hot
table's do, and its fixed-size activation arrays scan several times faster than Parquet's lists.

A deletion deletes the hot rows and lists the segment rows; nothing is rewritten then. A deleted
session leaves the files in `erase_pass` (xdb/store_storage.py): the hot table is sealed, so
experience.duckdb holds no timestep of it, and each segment holding a row of it is rewritten without
(a new file, the manifest swapped in one transaction, the old file detached and unlinked);
experience.duckdb is then rewritten whole (xdb/storage/vacuum.py), a copy the size of the hot table and the
small tables, not of the history. Rows compression deletes wait in `segment_deletes` until half a
segment's rows are listed, and adjacent small segments merge into larger ones.

DuckDB keeps a deleted row's bytes in its file's blocks until they are reused, and a segment is never
edited: a file rewritten without the rows, the old one unlinked, is what takes the bytes off the disk.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from xdb.private import fsync_path, private_dir, private_files
from xdb.sql import one, one_int, string_literal, transaction
from xdb.tables import HOT_TIMESTEPS

SEGMENTS_DIR = "segments"
# An old file outlives its rewrite this long before it is unlinked: a query that bound the view before the
# swap still opens it.
GRACE_S = 2.0
# Merging (`merge_due`): this many adjacent segments of a tier become one of the next, up to this many tiers
# above a sealed segment's size (a million rows sealed: 4M, 16M, 64M; ~50 files at a billion rows).
MERGE_FAN = 4
MERGE_TIERS = 3
SUFFIX = ".duckdb"


@dataclass(frozen=True)
class Segment:
    name: str
    first_id: int
    last_id: int
    rows: int


def folder(data_dir: Path) -> Path:
    return Path(data_dir) / SEGMENTS_DIR


def data_dir_of(cur: duckdb.DuckDBPyConnection) -> Path:
    """The data dir of the experience file `cur` is on: its segments are beside it."""
    path = one(cur.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"))[0]
    return Path(path).parent


def listed(cur: duckdb.DuckDBPyConnection) -> list[Segment]:
    return [Segment(*row) for row in cur.execute(
        "SELECT name, first_id, last_id, rows FROM segments ORDER BY first_id").fetchall()]


def alias(name: str) -> str:
    """The name a segment file is attached under: its own, so a view written in one process reads in any."""
    return "seg_" + name.removesuffix(SUFFIX).replace("-", "_")


def attach(cur: duckdb.DuckDBPyConnection, name: str) -> str:
    """Attach a segment beside the experience file (once a process); its alias."""
    path = folder(data_dir_of(cur)) / name
    cur.execute(f"ATTACH IF NOT EXISTS {string_literal(str(path))} AS {alias(name)} (READ_ONLY)")
    return alias(name)


def detach(cur: duckdb.DuckDBPyConnection, name: str) -> None:
    """A query already reading it runs to its end (it holds the file open)."""
    cur.execute(f"DETACH DATABASE IF EXISTS {alias(name)}")


def _rows(names: Iterable[str]) -> str:
    """Every row of these segments, each with `segment`: its file's name."""
    return " UNION ALL ".join(f"SELECT {string_literal(n)} AS segment, * FROM {alias(n)}.timesteps" for n in names)


def refresh_view(cur: duckdb.DuckDBPyConnection) -> None:
    """(Re)define `timesteps` over the hot table and the listed segments (attached here)."""
    names = [s.name for s in listed(cur)]
    branches = [f"SELECT * FROM {HOT_TIMESTEPS}"]
    deletes = names and cur.execute("SELECT 1 FROM segment_deletes LIMIT 1").fetchone() is not None
    for name in names:
        attach(cur, name)
        branches.append(f"SELECT * FROM {_source(name, bool(deletes))}")
    cur.execute(f"CREATE OR REPLACE VIEW timesteps AS {' UNION ALL '.join(branches)}")


@dataclass(frozen=True)
class Window:
    """A segment as recall reads it alone: its id range and the relation of its rows."""

    first_id: int
    last_id: int
    source: str


def windows(cur: duckdb.DuckDBPyConnection) -> list[Window]:
    """The listed segments in id order, each as a relation of its live rows ([]: none)."""
    sealed = listed(cur)
    deletes = sealed and cur.execute("SELECT 1 FROM segment_deletes LIMIT 1").fetchone() is not None
    return [Window(s.first_id, s.last_id, _source(s.name, bool(deletes))) for s in sealed]


def _source(name: str, deletes: bool) -> str:
    rows = f"{alias(name)}.timesteps"
    return f"(SELECT s.* FROM {rows} s ANTI JOIN segment_deletes d ON d.id = s.id)" if deletes else rows


def attach_listed(cur: duckdb.DuckDBPyConnection) -> None:
    """At a read-only open: the segments the view reads, attached."""
    for segment in listed(cur):
        attach(cur, segment.name)


def open_segments(cur: duckdb.DuckDBPyConnection) -> None:
    """At a read-write open: the view over this data dir's files, and the files no manifest lists (a seal
    or rewrite a crash cut short, an old file whose unlink it missed) removed."""
    keep = {s.name for s in listed(cur)}
    here = folder(data_dir_of(cur))
    if here.is_dir():
        for path in here.iterdir():
            if path.name not in keep:
                path.unlink(missing_ok=True)
    refresh_view(cur)


def hot_rows(cur: duckdb.DuckDBPyConnection) -> int:
    return one_int(cur.execute(f"SELECT count(*) FROM {HOT_TIMESTEPS}"))


def _write(cur: duckdb.DuckDBPyConnection, query: str, path: Path) -> int:
    """`query`'s rows, in id order, as the segment file `path` (a new DuckDB file holding them alone,
    written aside, fsynced, renamed); its bytes."""
    private_dir(path.parent)
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    cur.execute(f"ATTACH {string_literal(str(partial))} AS seg_being_written")
    try:
        cur.execute(f"CREATE TABLE seg_being_written.timesteps AS SELECT * FROM {HOT_TIMESTEPS} LIMIT 0")
        cur.execute(f"INSERT INTO seg_being_written.timesteps {query} ORDER BY id")
    finally:
        cur.execute("DETACH seg_being_written")  # checkpointed: the file holds every row, its log none
    private_files(partial)
    fsync_path(partial)
    os.replace(partial, path)
    fsync_path(path.parent)
    return path.stat().st_size


def _name(first_id: int, last_id: int) -> str:
    return f"{first_id:015d}-{last_id:015d}-{os.urandom(3).hex()}{SUFFIX}"


def _list(cur: duckdb.DuckDBPyConnection, path: Path, first_id: int, last_id: int, rows: int) -> None:
    """List a written segment, with the sessions it holds (a deletion reads only their segments)."""
    rows_of = f"{attach(cur, path.name)}.timesteps"
    cur.execute(f"INSERT INTO segments SELECT ?, ?, ?, ?, ?, now()::TIMESTAMP, coalesce(sum(strlen(content)), 0) "
                f"FROM {rows_of}", [path.name, first_id, last_id, rows, path.stat().st_size])
    cur.execute(f"INSERT INTO segment_sessions SELECT DISTINCT ?, session_id FROM {rows_of}", [path.name])


def _unlist(cur: duckdb.DuckDBPyConnection, names: list[str]) -> None:
    marks = ", ".join("?" * len(names))
    for table in ("segments", "segment_sessions"):
        cur.execute(f"DELETE FROM {table} WHERE {'name' if table == 'segments' else 'segment'} IN ({marks})", names)
    cur.execute(f"DELETE FROM segment_deletes WHERE segment IN ({marks})", names)


def seal(cur: duckdb.DuckDBPyConnection, lock: AbstractContextManager[Any] = nullcontext()) -> dict[str, Any] | None:
    """Move the hot table's committed rows into a new segment; None when it holds none (or a deletion
    took some of them while the file was written: the next pass seals them). `lock` is the one deletions
    hold, taken for the swap alone; the writer goes on appending (ids past these: one writer commits ids
    in ascending order)."""
    first, last, rows = one(cur.execute(f"SELECT min(id), max(id), count(*) FROM {HOT_TIMESTEPS}"))
    if not rows:
        return None
    name = _name(first, last)
    path = folder(data_dir_of(cur)) / name
    size = _write(cur, f"SELECT * FROM {HOT_TIMESTEPS} WHERE id BETWEEN {first} AND {last}", path)
    try:
        with lock, transaction(cur):
            if one_int(cur.execute(f"SELECT count(*) FROM {HOT_TIMESTEPS} WHERE id BETWEEN {first} AND {last}")) \
                    != rows:
                path.unlink()
                return None
            cur.execute(f"DELETE FROM {HOT_TIMESTEPS} WHERE id BETWEEN {first} AND {last}")
            _list(cur, path, first, last, rows)
            refresh_view(cur)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return {"segment": name, "rows": rows, "bytes": size}


def add(cur: duckdb.DuckDBPyConnection, query: str) -> Segment:
    """A segment of `query`'s rows (timesteps' columns, ids no listed segment or hot row holds), written
    and listed as a seal lists one: how a history generated or imported elsewhere joins the file."""
    first, last, rows = one(cur.execute(f"SELECT min(id), max(id), count(*) FROM ({query})"))
    path = folder(data_dir_of(cur)) / _name(first, last)
    _write(cur, query, path)
    with transaction(cur):
        _list(cur, path, first, last, rows)
        refresh_view(cur)
    return Segment(path.name, first, last, rows)


def delete_rows(cur: duckdb.DuckDBPyConnection, session_id: str, where: str, args: list[Any], *,
                erase: bool) -> int:
    """Delete the timesteps of `session_id` matching `where` (over the alias `t`), within the caller's
    transaction: the hot table's now, the segments' listed (only the segments holding the session are
    read). `erase`: the rows' text must leave the files (a session's deletion), so the next erase pass
    rewrites their segments. Returns the rows deleted."""
    deleted = one_int(cur.execute(f"DELETE FROM {HOT_TIMESTEPS} t WHERE {where}", args))
    names = [name for (name,) in cur.execute("SELECT segment FROM segment_sessions WHERE session_id = ?",
                                             [session_id]).fetchall()]
    if not names:
        return deleted
    source = f"({_rows(names)}) t WHERE ({where})"
    if erase:  # rows compression listed before now belong to a deletion too
        cur.execute(f"UPDATE segment_deletes SET erase = true WHERE NOT erase AND id IN (SELECT t.id FROM {source})",
                    args)
    listed_now = one_int(cur.execute(
        f"INSERT INTO segment_deletes SELECT t.id, t.segment, {erase}, coalesce(strlen(t.content), 0) FROM {source} "
        "AND t.id NOT IN (SELECT id FROM segment_deletes)", args))
    if listed_now:
        refresh_view(cur)  # the view leaves listed rows out from this transaction on
    return deleted + listed_now


def due(cur: duckdb.DuckDBPyConnection, *, erase_only: bool) -> list[Segment]:
    """The segments to rewrite: those holding an erased row, and (unless `erase_only`) those half deleted."""
    rows = cur.execute("""SELECT s.name, s.first_id, s.last_id, s.rows FROM segments s
        JOIN segment_deletes d ON d.segment = s.name GROUP BY ALL
        HAVING bool_or(d.erase) OR (NOT ? AND count(*) * 2 >= s.rows) ORDER BY s.first_id""", [erase_only])
    return [Segment(*row) for row in rows.fetchall()]


def rewrite(cur: duckdb.DuckDBPyConnection, segment: Segment,
            lock: AbstractContextManager[Any] = nullcontext()) -> Path | None:
    """Rewrite one segment without its listed rows and swap it in the manifest (under `lock`, the one
    deletions hold: one listing rows of it meanwhile could not be missed); returns the old file, to
    `retire` once no query can still be reading it (None: the segment changed meanwhile, left as it is)."""
    if cur.execute("SELECT 1 FROM segments WHERE name = ?", [segment.name]).fetchone() is None:
        return None  # rewritten since it was found due
    gone = one_int(cur.execute("SELECT count(*) FROM segment_deletes WHERE segment = ?", [segment.name]))
    here = folder(data_dir_of(cur))
    old = here / segment.name
    left = segment.rows - gone
    path = here / _name(segment.first_id, segment.last_id)
    if left > 0:
        _write(cur, f"SELECT * FROM {attach(cur, segment.name)}.timesteps WHERE id NOT IN "
                    f"(SELECT id FROM segment_deletes WHERE segment = {string_literal(segment.name)})", path)
    with lock, transaction(cur):
        if one_int(cur.execute("SELECT count(*) FROM segment_deletes WHERE segment = ?", [segment.name])) != gone:
            path.unlink(missing_ok=True)
            return None
        _unlist(cur, [segment.name])
        if left > 0:
            _list(cur, path, segment.first_id, segment.last_id, left)
        refresh_view(cur)
    return old


def merge_due(cur: duckdb.DuckDBPyConnection, base_rows: int) -> list[Segment]:
    """The first MERGE_FAN adjacent segments of one size tier below the last, if any: segments stay few
    (a read binds every file) and grow by tiers, as a log-structured merge tree's do, up to
    `base_rows * MERGE_FAN ** MERGE_TIERS` rows, a size one rewrite takes seconds over."""
    run: list[Segment] = []
    for segment in listed(cur):
        tier = _tier(segment.rows, base_rows)
        if tier >= MERGE_TIERS or (run and _tier(run[0].rows, base_rows) != tier):
            run = []
        if tier < MERGE_TIERS:
            run.append(segment)
        if len(run) == MERGE_FAN:
            return run
    return []


def _tier(rows: int, base_rows: int) -> int:
    tier = 0
    while rows >= base_rows * MERGE_FAN ** (tier + 1) and tier < MERGE_TIERS:
        tier += 1
    return tier


def merge(cur: duckdb.DuckDBPyConnection, run: list[Segment],
          lock: AbstractContextManager[Any] = nullcontext()) -> list[Path]:
    """Merge adjacent segments into one, their listed rows left out, swapped in under `lock` (as
    `rewrite`); returns the old files to `retire` ([]: one of them changed meanwhile, nothing merged)."""
    here = folder(data_dir_of(cur))
    names = [s.name for s in run]
    marks = ", ".join("?" * len(names))
    gone = one_int(cur.execute(f"SELECT count(*) FROM segment_deletes WHERE segment IN ({marks})", names))
    path = here / _name(run[0].first_id, run[-1].last_id)
    _write(cur, f"SELECT * EXCLUDE (segment) FROM ({_rows(names)}) WHERE id NOT IN "
                f"(SELECT id FROM segment_deletes WHERE segment IN ({', '.join(map(string_literal, names))}))", path)
    with lock, transaction(cur):
        still = one_int(cur.execute(f"SELECT count(*) FROM segments WHERE name IN ({marks})", names))
        if still != len(names) or one_int(cur.execute(
                f"SELECT count(*) FROM segment_deletes WHERE segment IN ({marks})", names)) != gone:
            path.unlink(missing_ok=True)
            return []
        _unlist(cur, names)
        _list(cur, path, run[0].first_id, run[-1].last_id, sum(s.rows for s in run) - gone)
        refresh_view(cur)
    return [here / n for n in names]


def retire(cur: duckdb.DuckDBPyConnection, paths: list[Path], since: float | None = None) -> None:
    """Detach and unlink files a rewrite replaced (at `since`, time.monotonic(); default now), once a
    query that bound the view before has had time to start reading them."""
    if not paths:
        return
    time.sleep(max(GRACE_S - (time.monotonic() - (time.monotonic() if since is None else since)), 0.0))
    for path in paths:
        detach(cur, path.name)
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".wal").unlink(missing_ok=True)
    fsync_path(paths[0].parent)


def link_into(cur: duckdb.DuckDBPyConnection, dest: Path) -> int:
    """The listed segments into the data dir `dest` (hard links: a segment is never changed in place; a
    copy across disks); the caller holds the storage lock from the experience file's copy to here, so the
    copy lists these files, and points the copy's view at them (`refresh_view`). Returns the bytes."""
    segments = listed(cur)
    total = 0
    if segments:
        private_dir(folder(dest))
    for segment in segments:
        source, target = folder(data_dir_of(cur)) / segment.name, folder(dest) / segment.name
        try:
            os.link(source, target)
        except OSError:  # another file system
            shutil.copyfile(source, target)
            private_files(target)
        total += target.stat().st_size
    return total


def first_id(cur: duckdb.DuckDBPyConnection) -> int | None:
    """The first timestep id kept (a segment's first, deleted or not: never past the first live one)."""
    first = one(cur.execute(f"SELECT min(v) FROM (SELECT min(first_id) AS v FROM segments UNION ALL "
                            f"SELECT min(id) FROM {HOT_TIMESTEPS})"))[0]
    return None if first is None else int(first)


def usage(cur: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The segments' count, rows and bytes, and the rows listed as deleted in them."""
    count, rows, size = one(cur.execute("SELECT count(*), coalesce(sum(rows), 0), coalesce(sum(bytes), 0) "
                                        "FROM segments"))
    return {"segments": int(count), "segment_rows": int(rows), "segment_bytes": int(size),
            "segment_deleted_rows": one_int(cur.execute("SELECT count(*) FROM segment_deletes")),
            "hot_rows": hot_rows(cur)}
