"""Fidelity tiers. HOT: rows still in a live session's context (after its last compaction, active
within `hot_seconds`). WARM: rows in a pinned window (counted against the warm quota). SUBMITTED:
rows in a window locked as evidence for a submission (not counted). Everything else is released and
may be compressed into COLD records, level by level, REPLY → SESSION → DAY → … → YEAR.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from enum import Enum, IntEnum
from typing import Any

import duckdb

from core.errors import Conflict, InvalidRequest, NotFound
from xdb.audit.log import AuditEvent
from xdb.interface import reads, writes
from xdb.schema import TOP_K
from xdb.sql import Row, one, one_int, transaction
from xdb.tags import BudStatus, find_tag

# What a timestep costs in the usage estimate besides its text: ids, tick, times, k slots.
ROW_BYTES = 64 + 8 * TOP_K


class Fidelity(str, Enum):
    HOT = "hot"
    WARM = "warm"
    SUBMITTED = "submitted"
    COLD = "cold"


class CompressionLevel(IntEnum):
    TOKEN = 0
    REPLY = 1
    SESSION = 2
    DAY = 3
    WEEK = 4
    MONTH = 5
    QUARTER = 6
    YEAR = 7


class QuotaExceeded(Conflict):
    """Pinning this window would exceed the warm quota."""


def hot_cutoff(hot_seconds: float) -> datetime:
    return datetime.fromtimestamp(time.time() - hot_seconds, tz=UTC).replace(tzinfo=None)


# Per session: ticks up to `released_through` were compacted out of the context; the rest stay HOT
# while the session was active after the cutoff (a `?` parameter).
SESSION_HEAT = """SELECT s.session_id, coalesce(c.last_end, -1) AS released_through, s.last_at
    FROM (SELECT session_id, max(created_at) AS last_at FROM timesteps GROUP BY 1) s
    LEFT JOIN (SELECT session_id, max(range_end) AS last_end FROM compaction_records GROUP BY 1) c USING (session_id)"""
PROTECTED_WINDOWS = "SELECT session_id, start_tick, end_tick FROM time_windows " \
                    "WHERE fidelity = 'submitted' OR (fidelity = 'warm' AND pinned)"


def range_stats(cur: duckdb.DuckDBPyConnection, session_id: str, start: int, end: int) -> Row:
    """(count, bytes, first created_at, last created_at) of a session's ticks start..end."""
    return one(cur.execute(
        f"SELECT count(*), count(*) * {ROW_BYTES} + coalesce(sum(strlen(content)), 0), "
        "min(created_at), max(created_at) "
        "FROM timesteps WHERE session_id = ? AND tick BETWEEN ? AND ?", [session_id, start, end]))


def _insert_window(cur: duckdb.DuckDBPyConnection, session_id: str, start: int, end: int, fidelity: str,
                   pinned: bool, reason: str | None, submissions: list[str]) -> dict[str, Any]:
    count, size, t0, t1 = range_stats(cur, session_id, start, end)
    if not count:
        raise NotFound(f"no timesteps in session {session_id!r} ticks {start}..{end}")
    wid = one_int(cur.execute(
        "INSERT INTO time_windows (session_id, start_tick, end_tick, start_time, end_time, fidelity, "
        "compression_level, pinned, pinned_reason, submission_ids, token_count, bytes, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, now()) RETURNING id",
        [session_id, start, end, t0, t1, fidelity, pinned, reason, submissions, count, size]))
    return get_window(cur, wid)


WINDOW_COLUMNS = ("id", "session_id", "start_tick", "end_tick", "fidelity", "compression_level", "pinned",
                  "pinned_reason", "submission_ids", "token_count", "bytes")


def get_window(cur: duckdb.DuckDBPyConnection, window_id: int) -> dict[str, Any]:
    row = cur.execute(f"SELECT {', '.join(WINDOW_COLUMNS)} FROM time_windows WHERE id = ?", [window_id]).fetchone()
    if row is None:
        raise NotFound(f"window {window_id} not found")
    return dict(zip(WINDOW_COLUMNS, row))


@reads
def list_windows(cur: duckdb.DuckDBPyConnection, session_id: str | None = None) -> list[dict[str, Any]]:
    rows = cur.execute(f"SELECT {', '.join(WINDOW_COLUMNS)} FROM time_windows WHERE ? IS NULL OR session_id = ? "
                       "ORDER BY id", [session_id, session_id]).fetchall()
    return [dict(zip(WINDOW_COLUMNS, r)) for r in rows]


def pinned_bytes(cur: duckdb.DuckDBPyConnection) -> int:
    return one_int(cur.execute("SELECT coalesce(sum(bytes), 0) FROM time_windows WHERE fidelity = 'warm' AND pinned"))


def pin(cur: duckdb.DuckDBPyConnection, session_id: str, tick_from: int, tick_to: int, reason: str | None,
        warm_quota_bytes: int | None) -> dict[str, Any]:
    """Keep a window at full detail (WARM) within the warm quota."""
    if tick_from < 0 or tick_to < tick_from:
        raise InvalidRequest(f"bad tick range {tick_from}..{tick_to}: need 0 <= tick_from <= tick_to")
    if cur.execute("SELECT 1 FROM session_ticks WHERE session_id = ?", [session_id]).fetchone() is None:
        raise NotFound(f"session {session_id!r} not found")
    _, size, _, _ = range_stats(cur, session_id, tick_from, tick_to)
    if warm_quota_bytes is not None and pinned_bytes(cur) + size > warm_quota_bytes:
        raise QuotaExceeded(f"pinning {size} bytes would exceed the warm quota of {warm_quota_bytes} bytes "
                            f"({pinned_bytes(cur)} already pinned)")
    return _insert_window(cur, session_id, tick_from, tick_to, Fidelity.WARM.value, True, reason, [])


@writes
def unpin(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, window_id: int) -> dict[str, Any]:
    """Release a WARM window (its rows may then be compressed away): a rewrite, chained in the audit."""
    window = get_window(cur, window_id)
    if window["fidelity"] == Fidelity.WARM.value and window["pinned"]:
        with transaction(cur):
            cur.execute("UPDATE time_windows SET pinned = false WHERE id = ? AND fidelity = 'warm'", [window_id])
            if audit is not None:
                audit("unpin_window", {"window_id": window_id, "session_id": window["session_id"],
                                       "ticks": [window["start_tick"], window["end_tick"]], "pinned": [True, False]})
    return get_window(cur, window_id)


@writes
def submit_evidence(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, bud: str | int,
                    submission_id: str) -> list[dict[str, Any]]:
    """Lock every window tagged with a READY bud as SUBMITTED evidence for `submission_id`; the bud is then
    SUBMITTED until the submission is resolved. Chained in the audit log. (`XDB.submit_evidence` does
    this and writes the submission's package in the same transaction.)"""
    with transaction(cur):
        return lock_evidence(cur, audit, bud, submission_id)


def ready_bud(cur: duckdb.DuckDBPyConnection, bud: str | int) -> dict[str, Any]:
    """The tag, which must be a READY bud (NotFound, Conflict)."""
    tag = find_tag(cur, bud)
    if tag is None:
        raise NotFound(f"tag {bud!r} not found")
    if (tag["tag_type"], tag["bud_status"]) != ("bud", BudStatus.READY.value):
        raise Conflict(f"tag {tag['name']!r} is {tag['bud_status'] or 'not a bud'}: evidence is submitted for a "
                       "ready bud", param="bud")
    return tag


def lock_evidence(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, bud: str | int,
                  submission_id: str) -> list[dict[str, Any]]:
    """submit_evidence's work, inside the caller's transaction."""
    tag = ready_bud(cur, bud)
    if cur.execute("SELECT 1 FROM bud_submissions WHERE submission_id = ?", [submission_id]).fetchone():
        raise Conflict(f"submission {submission_id!r} exists already", param="submission_id")
    spans = cur.execute("""
        SELECT a.session_id, coalesce(t.tick, e.t0, a.range_start), coalesce(t.tick, e.t1, a.range_end)
        FROM tag_applications a
        LEFT JOIN timesteps t ON a.target_type = 'timestep' AND t.id = a.timestep_id
        LEFT JOIN (SELECT session_id, request_id, min(tick) t0, max(tick) t1 FROM timesteps GROUP BY 1, 2) e
               ON a.target_type = 'event' AND e.request_id = a.event_id AND e.session_id = a.session_id
        WHERE a.tag_id = ? ORDER BY a.id""", [tag["id"]]).fetchall()
    windows = []
    for session_id, start, end in spans:
        if start is None:
            continue  # its rows are gone (compressed): nothing left to lock
        windows.append(_insert_window(cur, session_id, start, end, Fidelity.SUBMITTED.value, False,
                                      f"submission:{submission_id}", [submission_id]))
    cur.execute("INSERT INTO bud_submissions VALUES (?, ?, now(), NULL, NULL)", [submission_id, tag["id"]])
    cur.execute("UPDATE tags SET bud_status = ? WHERE id = ?", [BudStatus.SUBMITTED.value, tag["id"]])
    if audit is not None:
        audit("submit_evidence", {"submission_id": submission_id, "tag_id": tag["id"], "bud": tag["name"],
                                  "window_ids": [w["id"] for w in windows]})
    return windows


@writes
def resolve_submission(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, submission_id: str,
                       accepted: bool) -> list[dict[str, Any]]:
    """Release a submission's evidence: accepted → COLD (the tribe has it), rejected → WARM unpinned."""
    ids = [wid for (wid,) in cur.execute("SELECT id FROM time_windows WHERE list_contains(submission_ids, ?)",
                                         [submission_id]).fetchall()]
    if not ids:
        raise NotFound(f"submission {submission_id!r} not found")
    released = Fidelity.COLD.value if accepted else Fidelity.WARM.value
    # Releasing evidence rewrites its windows (and lets their rows be compressed): chained in the audit.
    with transaction(cur):
        cur.execute("UPDATE time_windows SET submission_ids = list_filter(submission_ids, s -> s != ?) "
                    "WHERE list_contains(submission_ids, ?)", [submission_id, submission_id])
        cur.execute("UPDATE time_windows SET fidelity = ?, pinned = false WHERE id IN (SELECT unnest(?)) "
                    "AND len(submission_ids) = 0", [released, ids])
        # Its bud is grafted (a lens learnt it) or rejected.
        cur.execute("UPDATE tags SET bud_status = ? WHERE id IN (SELECT tag_id FROM bud_submissions WHERE "
                    "submission_id = ?) AND bud_status = ?",
                    [BudStatus.GRAFTED.value if accepted else BudStatus.REJECTED.value, submission_id,
                     BudStatus.SUBMITTED.value])
        cur.execute("UPDATE bud_submissions SET resolved_at = now(), accepted = ? WHERE submission_id = ?",
                    [accepted, submission_id])
        if audit is not None:
            audit("resolve_submission", {"submission_id": submission_id, "accepted": accepted, "window_ids": ids,
                                         "fidelity_to": released})
    return [get_window(cur, wid) for wid in ids]


def fidelity_counts(cur: duckdb.DuckDBPyConnection, hot_seconds: float) -> dict[str, int | dict[str, int]]:
    """Timesteps per tier, plus COLD records by level. A row in a SUBMITTED window is submitted, else in a
    pinned WARM one warm, else past its session's compaction while the session is active hot, else
    released. Counted without a tier a row: only the rows within windows are matched one by one (a
    row-by-row tier over a year's history built an 8 GiB hash table)."""
    total, hot_all, submitted, warm, hot_in_windows = one(cur.execute(f"""
        WITH h AS ({SESSION_HEAT}),
        w AS (SELECT session_id, start_tick, end_tick, fidelity = 'submitted' AS submitted FROM time_windows
              WHERE fidelity = 'submitted' OR (fidelity = 'warm' AND pinned)),
        marked AS (SELECT t.session_id, t.tick, bool_or(w.submitted) AS submitted FROM timesteps t
                   JOIN w ON w.session_id = t.session_id AND t.tick BETWEEN w.start_tick AND w.end_tick
                   GROUP BY ALL)
        SELECT (SELECT count(*) FROM timesteps),
               (SELECT count(*) FROM timesteps t JOIN h USING (session_id)
                WHERE t.tick > h.released_through AND h.last_at > $cutoff),
               (SELECT count(*) FILTER (WHERE submitted) FROM marked),
               (SELECT count(*) FILTER (WHERE NOT submitted) FROM marked),
               (SELECT count(*) FROM marked m JOIN h USING (session_id)
                WHERE m.tick > h.released_through AND h.last_at > $cutoff)""",
                                                                        {"cutoff": hot_cutoff(hot_seconds)}))
    hot = hot_all - hot_in_windows
    levels = dict(cur.execute("SELECT compression_level, count(*) FROM compressed_records GROUP BY 1").fetchall())
    return {"submitted": submitted, "warm": warm, "hot": hot, "released": total - submitted - warm - hot,
            "cold": {CompressionLevel(lv).name.lower(): n for lv, n in sorted(levels.items())}}
