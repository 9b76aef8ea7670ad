"""The orchestrator's per-session State (its blocks as JSON), versioned: every save is a new version,
so a restart resumes from the last one and a recent earlier one can be recovered.

Only the last KEEP_VERSIONS versions of a session are kept: a snapshot holds the whole State (up to
the compaction threshold, tens of KB on a large window), so keeping one per turn of an hours-long
session would grow the file by that much every turn. Every input and output is in `timesteps`
anyway; the snapshots are only the orchestrator's working copy.
"""

from __future__ import annotations

import hashlib

import duckdb

from ahc.errors import InvalidRequest
from xdb.audit import AuditEvent
from xdb.sql import one_int, transaction

KEEP_VERSIONS = 16


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
    version = 1 if latest is None else int(latest[0]) + 1
    with transaction(cur):
        cur.execute("INSERT INTO session_states VALUES (?, ?, ?, ?, now())",
                    [session_id, version, state_json, digest])
        deleted = one_int(cur.execute("DELETE FROM session_states WHERE session_id = ? AND version <= ?",
                                      [session_id, version - keep]))
        if deleted and audit is not None:
            audit("prune_session_states", {"session_id": session_id, "versions_through": version - keep,
                                           "deleted": deleted, "kept_from_version": version - keep + 1})
    return version


def load_session_state(cur: duckdb.DuckDBPyConnection, session_id: str, version: int | None = None) -> str | None:
    row = cur.execute("SELECT state_json FROM session_states WHERE session_id = ? AND (? IS NULL OR version = ?) "
                      "ORDER BY version DESC LIMIT 1", [session_id, version, version]).fetchone()
    return None if row is None else row[0]
