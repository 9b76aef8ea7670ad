"""XDB's storage pass: a context compaction's record, retention, the quota's compression, the audit
log's retirement, and the sealed segments (xdb/storage/segments.py): their seal, rewrites and merges, and the
live part of an erasure.

A file is written holding nothing; the storage lock (`_compress_lock`, which deletions and compression
take) is held only for the transaction that swaps it into the manifest, and the writer never waits:
recording goes on throughout. `XDB` (xdb/store.py) holds
these methods with the rest of its interface.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import duckdb

from core.config import RetentionConfig
from core.errors import Conflict
from xdb.audit.log import AuditEvent, AuditLog
from xdb.interface import service, service_after_flush
from xdb.lake.lake import Lake
from xdb.storage import compression, evidence_package, retention, segments
from xdb.storage.compression import Summarize
from xdb.tags import BUD_MIN_EXAMPLES
from xdb.writer import Writer, last_timestep_id


class StorageMethods:
    """What these methods use of the XDB they are part of (set in XDB.__init__ and XDB.open)."""

    segment_rows: int
    summarize: Summarize | None
    hot_seconds: float
    quota_bytes: int | None
    compress_at: float
    export_ttl_s: float
    retention: RetentionConfig
    writer: Writer | None
    audit: AuditLog | None
    lake: Lake | None
    _compress_lock: threading.Lock
    cursor: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]
    audit_event: AuditEvent
    audit_bytes: Callable[[], int]
    expire_exports: Callable[[float, int | None], tuple[list[str], int]]
    _delete_recorded: Callable[..., dict[str, int]]
    data_dir: Path
    _write_lock: threading.Lock
    audit_head: Callable[[], tuple[int, str]]

    @service_after_flush
    def submit_evidence(self, bud: str | int, submission_id: str,
                        min_examples: int = BUD_MIN_EXAMPLES) -> dict[str, Any]:
        """Lock a READY bud's windows as SUBMITTED evidence and write its package under
        DATA_DIR/exports/<submission id>/ (xdb/storage/evidence_package.py), together or not at all:
        {"data": windows, "package": path, "manifest": ...}."""
        with self._write_lock, self.cursor() as cur:
            try:
                return evidence_package.submit_with_package(
                    cur, self.audit_event if self.audit is not None else None, self.audit_head, self.data_dir,
                    bud, submission_id, min_examples)
            finally:
                if self.writer is not None:  # the bud leaves READY: no concept tag to auto-tag with
                    self.writer.invalidate_auto_tags()

    @service_after_flush
    def compact(self, session_id: str | None = None, *, up_to_tick: int | None = None, summary: str | None = None,
                trigger: str = "manual", tokens_after: int | None = None, tokens_before: int | None = None,
                compress_released: bool = False, summarize: Callable[[str], str] | None = None) -> dict[str, Any]:
        """Record a context compaction of `session_id` (its rows up to `up_to_tick` leave HOT), then
        bring storage within the quota; `compress_released` compresses every released row even
        under the quota. `summarize` writes the summaries (default: the one given to `open`).

        `trigger` (compression.TRIGGERS) labels the compaction record and what this pass compresses for
        its own sake (released rows, retention's aged ones); what the quota pass compresses is always
        `storage_pressure`."""
        if trigger not in compression.TRIGGERS:
            raise ValueError(f"trigger must be one of {', '.join(compression.TRIGGERS)}, not {trigger!r}")
        summarize = summarize or self.summarize
        if session_id is not None and self.writer is not None:
            # The session's last tick bounds `up_to_tick`: rows already submitted count as recorded.
            self.writer.flush()
        with self._compress_lock, self.cursor() as cur:
            record = None
            if session_id is not None:
                record = compression.compaction_record(cur, session_id, up_to_tick, summary, summarize,
                                                       trigger, tokens_after, tokens_before)
            made: list[int] = []
            if compress_released:
                while step := compression._compress_replies(cur, summarize, self.hot_seconds, 100,
                                                            self.audit_event, trigger=trigger):
                    made += step
            if self.retention.verbatim_days is not None:
                made += retention.compress_aged(cur, self.retention.verbatim_days, summarize, self.hot_seconds,
                                                self.audit_event, trigger=trigger)
            deleted = []
            if self.retention.delete_after_days is not None:
                days = self.retention.delete_after_days
                deleted = retention.expired_sessions(cur, days)
                for expired in deleted:
                    self._delete_recorded(cur, expired, reason="retention", delete_after_days=days)
            audit_retired = self._retire_audit(cur)
            # The audit log counts against the quota (it cannot be compressed, but retention retires its
            # records with the rows they record), then exports: they are copies of what is recorded.
            audit_bytes = self.audit_bytes()
            target = None if self.quota_bytes is None else max(
                int(self.quota_bytes * self.compress_at) - audit_bytes, 0)
            room = None if target is None else max(target - compression.usage_bytes(cur), 0)
            deleted_exports, export_bytes = self.expire_exports(self.export_ttl_s, room)
            quota = None
            if target is not None:
                quota = compression.quota_pass(cur, target, summarize, self.hot_seconds, audit=self.audit_event)
                made += quota.record_ids
            report = {"compaction": record, "compressed_record_ids": made,
                      "quota_pass": None if quota is None else quota.report(),
                      "compressed_rows": compression.rows_compressed(cur, made), "deleted_sessions": deleted,
                      "vacuum_due": retention.vacuum_due(cur),
                      "deleted_exports": deleted_exports, "export_bytes": export_bytes,
                      "usage_bytes": compression.usage_bytes(cur) + audit_bytes, "audit_bytes": audit_bytes,
                      "quota_bytes": self.quota_bytes, "audit_retired": audit_retired,
                      "audit_quota_share": None if not self.quota_bytes else audit_bytes / self.quota_bytes}
        return {**report, "segments": self._segment_pass()}

    def _retire_audit(self, cur: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
        """Retire the audit records whose rows retention has removed from the experience file: those before
        its first timestep left (or past its last committed one), written before the first retention
        horizon configured. None when no horizon is, or nothing can go (xdb/audit/log.py's `retire`)."""
        days = [d for d in (self.retention.verbatim_days, self.retention.delete_after_days) if d is not None]
        if self.audit is None or not days:
            return None
        first, committed = segments.first_id(cur), last_timestep_id(cur)
        live_from = committed + 1 if first is None else min(int(first), committed + 1)
        shipped = None
        if self.lake is not None:  # a record leaves only once the lake holds it
            shipped = int(self.lake.status().get("watermarks", {}).get("audit_records", -1))
        return self.audit.retire(live_from, retention.cutoff(min(days)), "retention", shipped)

    def vacuum(self) -> dict[str, Any]:
        """Rewriting the experience file needs it closed: the XDB service does it between its calls
        (xdb/service/service.py); an XDB open in the server's own process cannot."""
        raise Conflict("vacuuming the experience file needs the XDB service (xdb.service_process: true, the "
                       "default); with it off, stop the server and run `ahc xdb vacuum --data-dir DIR`")


    @service
    def erase_pass(self) -> dict[str, Any]:
        """Take every deleted session's timesteps out of the segment files: the hot table sealed (what is
        in it then holds no deleted row), then each segment holding an erased row rewritten without it.
        What is left of a deletion is in experience.duckdb's free blocks, which a vacuum clears."""
        return self._rewrite_segments(erase_only=True, seal=True)

    def _segment_pass(self) -> dict[str, Any]:
        """The storage pass's part: the hot table sealed once it holds `segment_rows`, the segments that
        hold an erased row or are half deleted rewritten, and adjacent small ones merged."""
        with self.cursor() as cur:
            due = segments.hot_rows(cur) >= self.segment_rows
        report = self._rewrite_segments(erase_only=False, seal=due)
        merged = 0
        while True:
            with self.cursor() as cur:
                run = segments.merge_due(cur, self.segment_rows)
                old = segments.merge(cur, run, self._compress_lock) if run else []
            if not old:
                break
            with self.cursor() as cur:
                segments.retire(cur, old)
            merged += len(old)
        if merged:
            with self.cursor() as cur:
                report.update(segments.usage(cur))
        return {**report, "merged": merged}

    def _rewrite_segments(self, *, erase_only: bool, seal: bool) -> dict[str, Any]:
        sealed = None
        if seal:
            with self.cursor() as cur:
                sealed = segments.seal(cur, self._compress_lock)
        with self.cursor() as cur:
            due = segments.due(cur, erase_only=erase_only)
        rewritten, pending = 0, list[tuple[Path, float]]()
        for segment in due:
            with self.cursor() as cur:
                replaced = segments.rewrite(cur, segment, self._compress_lock)
            if replaced is not None:  # an old file goes once its grace has passed: the disk holds few more
                rewritten += 1
                now = time.monotonic()
                pending.append((replaced, now))
                self._retire([p for p in pending if now - p[1] >= segments.GRACE_S])
                pending = [p for p in pending if now - p[1] < segments.GRACE_S]
        self._retire(pending)
        with self.cursor() as cur:
            return {"sealed": sealed, "rewritten": rewritten, **segments.usage(cur)}

    def _retire(self, pending: list[tuple[Path, float]]) -> None:
        with self.cursor() as cur:
            for path, since in pending:
                segments.retire(cur, [path], since)
