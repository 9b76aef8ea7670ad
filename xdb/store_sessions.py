"""XDB's methods on a session's State and its deletion, across replicas when there is a lake.

A State is stored in the replica's own file (xdb/session_state.py). With `xdb.backend: ducklake` it is
also in the lake once `save_session_state` returns, a load takes the newest of this file's and any
replica's, and the session's ticks move past every replica's; a deletion ships its tombstone, and a
tombstone another replica shipped deletes the session's rows here (the lake shipper calls
`_apply_tombstone`). `XDB` (xdb/store.py) holds these methods with the rest of its interface.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import duckdb

from core.errors import NotFound
from xdb import session_state
from xdb.audit.log import AuditEvent, AuditLog
from xdb.interface import service, service_after_flush
from xdb.lake.lake import Lake, LakeUnavailable
from xdb.lake.reads import newer
from xdb.lake.session import LakeTicks, ResumableTickBook
from xdb.storage import backups, retention
from xdb.writer import Writer, last_timestep_id

log = logging.getLogger("ahc.xdb")


class SessionMethods:
    """What these methods use of the XDB they are part of (set in XDB.__init__ and XDB.open)."""

    data_dir: Path
    lake: Lake | None
    writer: Writer | None
    audit: AuditLog | None
    _ticks: ResumableTickBook
    _lake_ticks: LakeTicks
    _compress_lock: threading.Lock
    cursor: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]
    audit_event: AuditEvent

    @service
    def save_session_state(self, session_id: str, state_json: str) -> int:
        """Store a new State version. In ducklake mode it is in the lake when this returns (shipped with
        every row committed before it), or LakeUnavailable is raised (it stays stored locally)."""
        with self.cursor() as cur:
            version = session_state.save_session_state(cur, session_id, state_json, audit=self.audit_event)
        if self.lake is not None:
            self.lake.ship_now()
        return version

    @service
    def load_session_state(self, session_id: str, version: int | None = None) -> str | None:
        """The newest intact State (or exactly `version`, of this data dir's). In ducklake mode the
        newest of this data dir's and the lake's, any replica's; see `load_session_state_verified`."""
        if self.lake is not None and version is None:
            return self._resume_from_lake(session_id)[0]
        with self.cursor() as cur:
            return session_state.load_session_state(cur, session_id, version)

    def _resume_from_lake(self, session_id: str) -> tuple[str | None, list[int]]:
        """The newest intact State of the local file and the lake, by created_at then version; the
        session's ticks move past the largest tick any replica shipped for it, so they continue."""
        assert self.lake is not None
        with self.cursor() as cur:
            local, corrupt = session_state.newest_intact(cur, session_id)
            deleted_here = retention.tombstoned_at(cur, session_id)
        resume = self.lake.session_resume(session_id, deleted_here)
        remote, remote_corrupt, lake_tick = resume.state, resume.corrupt, resume.last_tick
        if local is not None and resume.deleted_at is not None and local.created_at <= resume.deleted_at:
            local = None  # another replica deleted the session since: this copy goes at the next poll
        if remote_corrupt:
            log.warning("session %r: %d newer State version(s) in the lake fail their SHA-256 check; skipped",
                        session_id, remote_corrupt)
        if lake_tick >= 0:
            self._lake_ticks.learn(session_id, lake_tick)
            self._ticks.advance(session_id, lake_tick)
        chosen = newer(local, remote)
        if chosen is not None and chosen.replica is not None and chosen.replica != self.lake.replica:
            log.info("session %r resumes from replica %r's State (version %d)", session_id, chosen.replica,
                     chosen.version)
        return (chosen.state_json if chosen is not None else None), corrupt

    @service
    def load_session_state_verified(self, session_id: str) -> tuple[str | None, list[int]]:
        """The newest intact State and the newer versions skipped as corrupted (logged here)."""
        if self.lake is not None:
            state, corrupt = self._resume_from_lake(session_id)
        else:
            with self.cursor() as cur:
                state, corrupt = session_state.load_verified(cur, session_id)
        if corrupt:
            log.warning("session %r: State versions %s fail their SHA-256 check; loaded the newest intact one",
                        session_id, corrupt)
        return state, corrupt

    @service
    def rollback_session(self, session_id: str, version: int) -> dict[str, Any]:
        with self.cursor() as cur:
            result = session_state.rollback(cur, session_id, version, audit=self.audit_event)
        if self.lake is not None:
            self.lake.ship_now()  # the restored State is the newest, in the lake too
        return result

    def _apply_tombstone(self, stone: retention.Tombstone) -> dict[str, int]:
        """Another replica deleted a session: delete this file's rows of it up to then (the lake shipper's
        callback; queued rows are written first, so none of them comes back after)."""
        with self._compress_lock, self.cursor() as cur:
            erasure = self._erasure(stone.session_id)
            deleted, destroy = retention.apply_tombstone(cur, stone, self.audit_event, erasure)
            if self.audit is not None and destroy:
                self.audit.destroy_keys(destroy)
            elif erasure is not None and erasure.keys and any(deleted.values()):
                log.warning("session %r: rows recorded here after replica %r deleted it are sealed under the key of "
                            "the rows its tombstone deleted; the key is kept so that they stay readable in the "
                            "audit log", stone.session_id, stone.replica)
        if any(deleted.values()):  # then from the kept backups and exports, on a thread
            backups.session_deleted(self.data_dir, stone.session_id, stone)
        return deleted

    def _erasure(self, session_id: str) -> retention.Erasure | None:
        """Retire the session's audit keys, then wait for every row recorded before that to be committed,
        so the deletion erases exactly the rows sealed under them: a row recorded meanwhile (a stream
        still running) is sealed under a new key and stays, readable in the log, never left in the
        experience file with its audit content destroyed. None without an audit log."""
        if self.audit is None:
            if self.writer is not None and self.writer.queue_depth():
                self.writer.flush()
            return None
        # Rows committed before the retirement go too, whether the log holds them or not (loaded from
        # an export, generated): their ids are below any the log seals under a new key.
        with self.cursor() as cur:
            committed = last_timestep_id(cur)
        retired = self.audit.retire_keys(session_id)
        if self.writer is not None:
            self.writer.flush()
        through = self.audit.last_timestep_before(retired)
        return retention.Erasure(retired.keys, max(committed, -1 if through is None else through))

    def _delete_recorded(self, cur: duckdb.DuckDBPyConnection, session_id: str, **why: object) -> dict[str, int]:
        """Delete a session's rows (the caller holds the compression lock), its keys destroyed once the
        experience file has committed the deletion: a crash in between leaves a deletion the next start
        finishes (`finish_deletions`)."""
        erasure = self._erasure(session_id)
        deleted = retention.delete_session(cur, session_id, self.audit_event, erasure, **why)
        self._destroy_keys(erasure)
        backups.session_deleted(self.data_dir, session_id)  # then from the kept backups and exports, on a thread
        return deleted

    def _destroy_keys(self, erasure: retention.Erasure | None) -> None:
        if erasure is not None and self.audit is not None:
            self.audit.destroy_keys(erasure.keys)

    @service_after_flush
    def delete_session(self, session_id: str) -> dict[str, int]:
        """Every row of the session (tokens, tags, comments, windows, records, States) recorded before
        this call; an audit event."""
        with self._compress_lock, self.cursor() as cur:
            here = cur.execute("SELECT 1 FROM session_ticks WHERE session_id = ? UNION ALL SELECT 1 FROM "
                               "session_states WHERE session_id = ? LIMIT 1", [session_id, session_id]).fetchone()
            if here is None and not self._in_lake(session_id):
                raise NotFound(f"session {session_id!r} not found")
            # Its tick counter goes on: rows of a session that comes back never reuse a deleted tick.
            deleted = self._delete_recorded(cur, session_id, reason="request")
        if self.lake is not None:
            try:
                self.lake.ship_now()  # the tombstone, and the lake's rows with it, gone before this returns
            except LakeUnavailable:
                log.warning("session %r deleted here; the lake is unreachable, its tombstone goes with the next "
                            "ship", session_id)
        return deleted

    def _in_lake(self, session_id: str) -> bool:
        """Whether another replica shipped anything of the session since its last deletion (a cluster's
        DELETE may reach a replica that never served it)."""
        if self.lake is None:
            return False
        resume = self.lake.session_resume(session_id)
        return resume.state is not None or resume.last_tick >= 0 and resume.deleted_at is None


def finish_deletions(conn: duckdb.DuckDBPyConnection, audit: AuditLog) -> int:
    """Finish the deletions a crash cut short after the audit log chained them (their keys still in
    audit.keys): their rows leave the experience file, then their keys are destroyed. Returns how many."""
    pending = audit.pending_deletions()
    for deletion in pending:
        log.warning("session %r: finishing its deletion (audit seq=%d) that a crash cut short",
                    deletion.session_id, deletion.seq)
        with conn.cursor() as cur:
            retention.finish_deletion(cur, deletion)
        audit.destroy_keys(deletion.keys)
        backups.session_deleted(audit.path.parent.parent, deletion.session_id)  # and from the kept copies
    return len(pending)
