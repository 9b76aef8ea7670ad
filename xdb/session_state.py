"""The orchestrator's per-session State (its blocks as JSON), versioned: every save is a new version,
so a restart resumes from the last one and a recent earlier one can be recovered.

Each version's SHA-256 is checked when it is read: a snapshot whose bytes no longer match (a damaged
file, a hand edit) is skipped for the newest one that does, and reported. A rollback stores an earlier
version again as the newest, so the history itself is never rewritten.

Only the last KEEP_VERSIONS versions of a session are kept: a snapshot holds the whole State (up to
the compaction threshold, tens of KB on a large window), so keeping one per turn of an hours-long
session would grow the file by that much every turn. Every input and output is in `timesteps`
anyway; the snapshots are only the orchestrator's working copy.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any

import duckdb

from core.errors import Conflict, InvalidRequest, NotFound
from xdb.audit.log import AuditEvent
from xdb.interface import reads
from xdb.owner import owned
from xdb.recall.browse import MAIN_THREADS, SIDE, TURN_ROWS, iso
from xdb.sql import one_int, transaction

KEEP_VERSIONS = 16


@dataclass(frozen=True)
class StateVersion:
    """One intact stored State: its version, its JSON, when it was saved (naive UTC) and, when it came
    from the shared lake (`xdb.backend: ducklake`), the replica that saved it (None: this data dir)."""

    version: int
    state_json: str
    created_at: dt.datetime
    replica: str | None = None


def save_session_state(cur: duckdb.DuckDBPyConnection, session_id: str, state_json: str,
                       keep: int = KEEP_VERSIONS, audit: AuditEvent | None = None) -> int:
    """Store a new version unless it equals the latest, and drop those older than the last `keep`
    (chained in the audit log when any are dropped); returns the version holding it."""
    if not session_id:
        raise InvalidRequest("session_id must not be empty")
    digest = hashlib.sha256(state_json.encode()).hexdigest()
    latest = cur.execute("SELECT version, sha256 FROM session_states WHERE session_id = ? "
                         "ORDER BY version DESC LIMIT 1", [session_id]).fetchone()
    if latest is not None and latest[1] == digest:
        return int(latest[0])
    return _append(cur, session_id, state_json, 0 if latest is None else int(latest[0]), keep, audit)


def load_session_state(cur: duckdb.DuckDBPyConnection, session_id: str, version: int | None = None) -> str | None:
    """The newest intact version (or `version`, which must be intact); None when there is none."""
    return load_verified(cur, session_id, version)[0]


def load_verified(cur: duckdb.DuckDBPyConnection, session_id: str,
                  version: int | None = None) -> tuple[str | None, list[int]]:
    """The newest version whose SHA-256 matches its bytes (or exactly `version`), and the newer
    versions skipped because theirs did not."""
    found, corrupt = newest_intact(cur, session_id, version)
    return (found.state_json if found is not None else None), corrupt


def newest_intact(cur: duckdb.DuckDBPyConnection, session_id: str,
                  version: int | None = None) -> tuple[StateVersion | None, list[int]]:
    """`load_verified` with the version's number and time."""
    rows = cur.execute("SELECT version, state_json, sha256, created_at FROM session_states WHERE session_id = ? "
                       "AND (? IS NULL OR version = ?) ORDER BY version DESC",
                       [session_id, version, version]).fetchall()
    corrupt: list[int] = []
    for number, state_json, digest, created_at in rows:
        if hashlib.sha256(state_json.encode()).hexdigest() == digest:
            return StateVersion(int(number), state_json, created_at), corrupt
        corrupt.append(int(number))
    if version is not None and corrupt:
        raise Conflict(f"version {version} of session {session_id!r} is corrupted (its SHA-256 does not match)")
    return None, corrupt


@reads
def state_versions(cur: duckdb.DuckDBPyConnection, session_id: str) -> list[dict[str, Any]]:
    """A session's stored versions, oldest first, each with whether its bytes match its SHA-256."""
    rows = cur.execute("SELECT version, sha256, created_at, strlen(state_json), "
                       "sha256(state_json) = sha256 FROM session_states WHERE session_id = ? ORDER BY version",
                       [session_id]).fetchall()
    if not rows:
        raise NotFound(f"session {session_id!r} has no stored versions")
    return [{"version": v, "sha256": digest, "created_at": at.isoformat() + "Z", "bytes": size, "intact": ok}
            for v, digest, at, size, ok in rows]


def rollback(cur: duckdb.DuckDBPyConnection, session_id: str, version: int, keep: int = KEEP_VERSIONS,
             audit: AuditEvent | None = None) -> dict[str, Any]:
    """Store `version` again as the session's newest version; returns the new version's number."""
    state_json, _ = load_verified(cur, session_id, version)
    if state_json is None:
        raise NotFound(f"session {session_id!r} has no version {version}")
    latest = one_int(cur.execute("SELECT max(version) FROM session_states WHERE session_id = ?", [session_id]))
    new = _append(cur, session_id, state_json, latest, keep, audit)
    if audit is not None:
        audit("rollback_session", {"session_id": session_id, "restored_version": version, "new_version": new})
    return {"session_id": session_id, "version": new, "restored_from": version}


def _append(cur: duckdb.DuckDBPyConnection, session_id: str, state_json: str, latest: int, keep: int,
            audit: AuditEvent | None) -> int:
    """A new newest version even when it equals the latest (a rollback to the latest is still a step)."""
    version = latest + 1
    digest = hashlib.sha256(state_json.encode()).hexdigest()
    with transaction(cur):
        cur.execute("INSERT INTO session_states VALUES (?, ?, ?, ?, now())", [session_id, version, state_json, digest])
        deleted = one_int(cur.execute("DELETE FROM session_states WHERE session_id = ? AND version <= ?",
                                      [session_id, version - keep]))
        if deleted and audit is not None:
            audit("prune_session_states", {"session_id": session_id, "versions_through": version - keep,
                                           "deleted": deleted, "kept_from_version": version - keep + 1})
    return version


@reads
def list_sessions(cur: duckdb.DuckDBPyConnection, owner: str, limit: int = 100,
                  after: str | None = None) -> list[dict[str, Any]]:
    """One tenant's sessions (`owner`, xdb/owner.py), in id order from `after`: each with its last tick,
    its stored State versions, and its turns (their count, tokens and when the last one ended)."""
    condition, params = owned("session_id", owner)
    rows = cur.execute(f"""
        SELECT session_id, t.last_tick, s.latest, s.n, s.updated_at
        FROM session_ticks t FULL OUTER JOIN (SELECT session_id, max(version) latest, count(*) n,
                                                     max(created_at) updated_at
                                              FROM session_states GROUP BY 1) s USING (session_id)
        WHERE {condition} AND (? IS NULL OR session_id > ?)
        ORDER BY session_id LIMIT ?""", [*params, after, after, limit]).fetchall()
    turns = _turn_totals(cur, [row[0] for row in rows])
    return [{"session_id": sid, "last_tick": tick, "latest_version": latest, "versions": n or 0,
             "updated_at": iso(at), **turns.get(sid, NO_TURNS)}
            for sid, tick, latest, n, at in rows]


NO_TURNS: dict[str, Any] = {"turns": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0,
                            "last_turn_at": None}


def _turn_totals(cur: duckdb.DuckDBPyConnection, session_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each session's turn records summed: its turns (side calls apart), the tokens of every request, and
    when the last ended."""
    if not session_ids:
        return {}
    rows = cur.execute(f"""
        WITH t AS (
            SELECT session_id, tick, created_at, CAST(metadata AS JSON) -> 'turn' AS m FROM timesteps
            WHERE session_id IN (SELECT unnest(?)) AND {TURN_ROWS}),
        {MAIN_THREADS}
        SELECT session_id, count(*) FILTER (WHERE NOT {SIDE}), sum((m ->> 'prompt_tokens')::BIGINT),
               sum((m ->> 'cached_tokens')::BIGINT), sum((m ->> 'completion_tokens')::BIGINT), max(created_at)
        FROM t JOIN main USING (session_id) GROUP BY session_id""", [session_ids]).fetchall()
    return {sid: {"turns": count, "prompt_tokens": prompt or 0, "cached_tokens": cached or 0,
                  "completion_tokens": completion or 0, "last_turn_at": iso(at)}
            for sid, count, prompt, cached, completion, at in rows}
