"""Retention: how long experience stays verbatim, and when a whole session goes.

- Token rows older than `verbatim_days` are compressed into REPLY records (and coarser ones as the
  quota asks), whatever the quota: the detail of last month is summarised, its activations and tags kept.
- A session idle for `delete_after_days` (no row, record or saved state since) is deleted, every table
  of it, unless a window of it is pinned (WARM) or locked as evidence (SUBMITTED).

Both leave pinned and SUBMITTED rows alone, and every deletion is chained in the audit log inside the
transaction that deletes, as compression's are.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb

from xdb.audit.log import AuditEvent
from xdb.audit.verify import Deletion
from xdb.sql import one_int, transaction
from xdb.storage import segments
from xdb.storage.compression import BATCH_GROUPS, SCHEDULED, Summarize, _compress_replies
from xdb.storage.fidelity import hot_cutoff
from xdb.tables import SESSION, TABLES

DAY_S = 86_400.0
# xdb_meta's key for when the experience file was last rewritten whole (xdb/storage/vacuum.py): a deletion since
# then leaves its rows' bytes in the file's blocks until the next vacuum.
VACUUMED_AT = "vacuumed_at"
# A session's rows written up to a tombstone's time, per table (the column that dates a row). Its tick
# counter stays: rows recorded after the deletion continue the ticks, as on the replica that deleted.
DATED: tuple[tuple[str, str], ...] = tuple((t.name, t.time_column) for t in TABLES
                                           if t.dated and t.time_column is not None)
# Every table that holds a session's rows: the dated ones, then the tick counter (the order in which a
# deletion reports its counts).
TIMESTEPS = "timesteps"  # the recorded tokens: the rows the audit log seals under the session's keys
SESSION_TABLES = (*(name for name, _ in DATED),
                  *(t.name for t in TABLES if t.session_column == SESSION and not t.dated))


def cutoff(days: float) -> datetime:
    """Rows written before this are older than `days` (naive UTC, as rows store their times)."""
    return hot_cutoff(days * DAY_S)


def compress_aged(cur: duckdb.DuckDBPyConnection, verbatim_days: float, summarize: Summarize | None,
                  hot_seconds: float, audit: AuditEvent | None = None, max_steps: int = 1000,
                  trigger: str = SCHEDULED) -> list[int]:
    """REPLY records for every reply last written more than `verbatim_days` ago (not pinned, not
    SUBMITTED), labelled `trigger` (the pass's); returns the new records' ids."""
    made: list[int] = []
    older_than = cutoff(verbatim_days)
    for _ in range(max_steps):
        step = _compress_replies(cur, summarize, hot_seconds, BATCH_GROUPS, audit, older_than=older_than,
                                 trigger=trigger)
        if not step:
            break
        made += step
    return made


# The tables whose rows keep a session from being deleted as idle, with the column that dates them.
ACTIVITY: tuple[tuple[str, str], ...] = tuple((t.name, t.activity_column) for t in TABLES
                                              if t.session_column == SESSION and t.activity_column is not None)
_SEEN = " UNION ALL ".join(f"SELECT session_id, {column} AS seen FROM {table} WHERE session_id IS NOT NULL"
                           for table, column in ACTIVITY)
EXPIRED = f"""
    WITH activity AS (
        SELECT session_id, max(seen) AS last_at FROM ({_SEEN})
        GROUP BY session_id)
    SELECT a.session_id FROM activity a
    WHERE a.last_at < ? AND NOT EXISTS (
        SELECT 1 FROM time_windows w WHERE w.session_id = a.session_id
        AND (w.fidelity = 'submitted' OR (w.fidelity = 'warm' AND w.pinned)))
    ORDER BY a.last_at, a.session_id LIMIT ?"""


def expired_sessions(cur: duckdb.DuckDBPyConnection, delete_after_days: float, limit: int = 1000) -> list[str]:
    """The sessions idle for `delete_after_days` that nothing protects, longest idle first."""
    return [row[0] for row in cur.execute(EXPIRED, [cutoff(delete_after_days), limit]).fetchall()]


@dataclass(frozen=True)
class Erasure:
    """What a deletion erases of a session's recorded tokens when there is an audit log: the timesteps
    up to `through_timestep` (-1: none), the ones sealed under `keys`, which the deletion destroys once
    committed. Rows recorded after the keys were retired are sealed under a new key and stay."""

    keys: list[int]
    through_timestep: int


def delete_session(cur: duckdb.DuckDBPyConnection, session_id: str, audit: AuditEvent | None = None,
                   erasure: Erasure | None = None, **why: object) -> dict[str, int]:
    """Every row of one session (its timesteps up to the erasure's, with one), in one transaction chained
    in the audit log, and its tombstone (which the shared lake and the other replicas follow); rows
    deleted per table."""
    with transaction(cur):
        deleted = {table: _delete(cur, table, f"t.session_id = ?{_through(table, erasure)}", [session_id])
                   for table in SESSION_TABLES}
        cur.execute("INSERT INTO session_tombstones (session_id, deleted_at, reason) VALUES (?, ?, ?)",
                    [session_id, hot_cutoff(0.0), str(why.get("reason", "request"))])
        if audit is not None:
            named = {} if erasure is None else {"keys_destroyed": erasure.keys,
                                                "through_timestep": erasure.through_timestep}
            audit("delete_session", {"session_id": session_id, **why, "deleted": deleted, **named})
    return deleted


def _through(table: str, erasure: Erasure | None) -> str:
    return "" if erasure is None or table != TIMESTEPS else f" AND t.id <= {int(erasure.through_timestep)}"


def _delete(cur: duckdb.DuckDBPyConnection, table: str, where: str, args: list[Any]) -> int:
    """A session's rows of `table` matching `where` (over the alias `t`, the session its first argument),
    in the caller's transaction; its timesteps' text leaves their segments at the next erase pass
    (xdb/storage/segments.py)."""
    if table == TIMESTEPS:
        return segments.delete_rows(cur, str(args[0]), where, args, erase=True)
    return one_int(cur.execute(f"DELETE FROM {table} t WHERE {where}", args))


def finish_deletion(cur: duckdb.DuckDBPyConnection, deletion: Deletion) -> dict[str, int]:
    """Carry out a deletion the audit log chained but a crash kept from the experience file (or whose
    keys it kept): the session's rows up to it, and its tombstone if missing. Chained already: no event."""
    with transaction(cur):
        deleted = {}
        for table, column in DATED:
            bound = f"t.id <= {int(deletion.through_timestep)}" \
                if table == TIMESTEPS and deletion.through_timestep is not None else f"t.{column} <= ?"
            args = [deletion.session_id] + ([] if bound.startswith("t.id") else [deletion.at])
            deleted[table] = _delete(cur, table, f"t.session_id = ? AND {bound}", args)
        if cur.execute("SELECT 1 FROM session_tombstones WHERE session_id = ? AND deleted_at >= ?",
                       [deletion.session_id, deletion.at]).fetchone() is None:
            cur.execute("INSERT INTO session_tombstones (session_id, deleted_at, reason) VALUES (?, ?, ?)",
                        [deletion.session_id, deletion.at, "request"])
    return deleted


@dataclass(frozen=True)
class Tombstone:
    """Another replica's deletion of a session, as the lake holds it."""

    replica: str
    id: int
    session_id: str
    deleted_at: datetime
    reason: str


def apply_tombstone(cur: duckdb.DuckDBPyConnection, stone: Tombstone, audit: AuditEvent | None = None,
                    erasure: Erasure | None = None) -> tuple[dict[str, int], list[int]]:
    """Delete this file's rows of the session written up to the tombstone (once per tombstone), in one
    transaction chained in the audit log; returns the rows deleted per table ({} when applied before) and
    the keys to destroy once committed. With an erasure, its keys are destroyed only when no row sealed
    under them stays: rows recorded here after the other replica's deletion (the session carried on here)
    stay, and so does the key that keeps their content readable in the log, which the event names
    (`keys_kept`)."""
    with transaction(cur):
        if cur.execute("SELECT 1 FROM applied_tombstones WHERE replica = ? AND id = ?",
                       [stone.replica, stone.id]).fetchone() is not None:
            return {}, []
        deleted = {table: _delete(cur, table, f"t.session_id = ? AND t.{column} <= ?",
                                  [stone.session_id, stone.deleted_at])
                   for table, column in DATED}
        cur.execute("INSERT INTO applied_tombstones VALUES (?, ?, ?, ?, ?)",
                    [stone.replica, stone.id, stone.session_id, stone.deleted_at, hot_cutoff(0.0)])
        named: dict[str, object] = {}
        destroy: list[int] = []
        if erasure is not None and erasure.keys:
            kept = one_int(cur.execute(f"SELECT count(*) FROM {TIMESTEPS} WHERE session_id = ? AND id <= ?",
                                       [stone.session_id, erasure.through_timestep]))
            if kept:
                named = {"keys_kept": erasure.keys, "rows_kept": kept}
            else:
                destroy = erasure.keys
                named = {"keys_destroyed": erasure.keys, "through_timestep": erasure.through_timestep}
        if audit is not None and (any(deleted.values()) or destroy):
            audit("delete_session", {"session_id": stone.session_id, "reason": "tombstone", **named,
                                     "tombstone": {"replica": stone.replica, "id": stone.id,
                                                   "reason": stone.reason,
                                                   "deleted_at": stone.deleted_at.isoformat() + "Z"},
                                     "deleted": deleted})
    return deleted, destroy


def tombstoned_at(cur: duckdb.DuckDBPyConnection, session_id: str) -> datetime | None:
    """When this file last saw the session deleted (its own deletion or one applied), or None."""
    row = cur.execute("SELECT max(deleted_at) FROM (SELECT deleted_at FROM session_tombstones WHERE session_id = ? "
                      "UNION ALL SELECT deleted_at FROM applied_tombstones WHERE session_id = ?)",
                      [session_id, session_id]).fetchone()
    return None if row is None else row[0]


def vacuum_due(cur: duckdb.DuckDBPyConnection) -> bool:
    """Whether a session was deleted here since the experience file was last vacuumed."""
    row = cur.execute("SELECT value FROM xdb_meta WHERE key = ?", [VACUUMED_AT]).fetchone()
    since = datetime.fromisoformat(row[0]) if row else datetime.min
    found = cur.execute("SELECT 1 FROM session_tombstones WHERE deleted_at > ? UNION ALL "
                        "SELECT 1 FROM applied_tombstones WHERE applied_at > ? LIMIT 1", [since, since]).fetchone()
    return found is not None
