"""XDB, the facade: opens both files, owns the writer, and serves every read and small write. Its methods
on a session's State and deletion are in xdb/store_sessions.py, those on the shared lake in
xdb/store_lake.py; XDB holds them all.

DuckDB allows one process per file, so the server's XDB is the only way in while it runs. Within the
process, the writer's thread owns the experience connection; every other call runs on a fresh cursor
of it (a cursor is its own DuckDB connection on the same database, safe to use from any thread).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, closing
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import duckdb

from core.config import XDBConfig
from core.errors import InvalidRequest, NotFound
from xdb import documents, export, runs, sql, tags
from xdb.audit.chain import GENESIS, HEAD_FILE, read_heads
from xdb.audit.log import AuditEvent, AuditLog, copy_database
from xdb.audit.verify import AuditReport
from xdb.concepts import ConceptIndex
from xdb.interface import Cursor, check_entry, service, service_after_flush
from xdb.lake.lake import Lake
from xdb.lake.session import LakeTicks, ResumableTickBook, TickCalls
from xdb.owner import EVERY
from xdb.private import private_dir, private_files, private_tree
from xdb.recall import browse, insights, relations
from xdb.recall.recall import RecallFilters, recall, recall_within, timestep
from xdb.recall.tag_cache import TagCache
from xdb.schema import EXPERIENCE_FILE, TOP_K, open_experience
from xdb.sql import digest, one, transaction
from xdb.storage import compression, fidelity, segments
from xdb.store_lake import LakeMethods
from xdb.store_sessions import SessionMethods, finish_deletions
from xdb.store_storage import StorageMethods
from xdb.writer import Writer, last_timestep_id, replay_from_audit

P = ParamSpec("P")
R = TypeVar("R")

AUDIT_FILE = Path("audit") / "audit.duckdb"


def default_threads() -> int:
    """DuckDB threads for the experience file: a quarter of the cores, at least one. The writer
    already overlaps its own three stages, and the process serves a model besides; DuckDB's
    parallelism on top of that costs more CPU than it saves (on 2 cores, one DuckDB thread inserts
    at half the CPU of two and answers the benchmark's recalls faster), while a big machine keeps
    several for the scans no zone map can prune."""
    return max(1, (os.cpu_count() or 1) // 4)


class XDB(SessionMethods, LakeMethods, TickCalls, StorageMethods):
    def __init__(self, data_dir: Path, conn: duckdb.DuckDBPyConnection, audit: AuditLog | None,
                 concepts: ConceptIndex, writer: Writer | None, config: XDBConfig,
                 summarize: Callable[[str], str] | None) -> None:
        self.data_dir, self.conn, self.audit, self.concepts, self.writer = data_dir, conn, audit, concepts, writer
        # Plain attributes, not reads through `config`: a caller may retune them on a live XDB.
        self.quota_bytes = config.quota_bytes
        self.warm_quota_bytes = config.warm_quota_bytes
        if self.warm_quota_bytes is None and self.quota_bytes is not None:
            self.warm_quota_bytes = self.quota_bytes // 2
        self.summarize, self.hot_seconds = summarize, config.hot_seconds
        self.compress_at, self.retention = config.compress_at, config.retention
        self.max_document_bytes = config.max_document_bytes
        self.segment_rows = config.segment_rows
        self.export_ttl_s = config.export_ttl_s
        self.recall_deadline_s = config.recall_deadline_s
        self._ticks = ResumableTickBook(self.committed_tick, config.max_tick_sessions)
        # `xdb.backend: ducklake`: the shared lake (xdb/lake/lake.py) and the last ticks learnt from it.
        self.lake: Lake | None = None
        self._lake_ticks = LakeTicks(config.max_tick_sessions)
        self._compress_lock = threading.Lock()
        self._documents_lock = threading.Lock()  # a new version reads the last one: one writer at a time
        self._write_lock = threading.Lock()  # `write`: the small writes, one at a time (no conflicting commits)
        self.tag_cache = TagCache(config.tag_cache_size)
        self._closed = False
        self._arm_auto_tags()

    @classmethod
    def open(cls, data_dir: Path | str, config: XDBConfig | None = None, *, read_only: bool = False,
             on_commit: Callable[[int], None] | None = None,
             summarize: Callable[[str], str] | None = None) -> XDB:
        """Open (creating and migrating) DATA_DIR/experience.duckdb and DATA_DIR/audit/audit.duckdb,
        tuned by `config` (default: XDBConfig()). A corrupt or foreign file raises ValueError and is
        left untouched. `read_only` opens the experience file alone, for reading (`ahc xdb recall`),
        with no writer."""
        config = config or XDBConfig()
        data_dir = Path(data_dir)
        if not read_only:
            private_dir(data_dir)
        conn = open_experience(data_dir / EXPERIENCE_FILE, read_only=read_only)
        if not read_only:
            private_files(data_dir / EXPERIENCE_FILE, data_dir / (EXPERIENCE_FILE + ".wal"))
        audit = writer = None
        try:
            conn.execute(f"SET threads = {int(config.threads or default_threads())}")
            if read_only:
                segments.attach_listed(conn)
            else:
                segments.open_segments(conn)
                audit = AuditLog.open(data_dir / AUDIT_FILE)
                replay_from_audit(conn, audit)
                finish_deletions(conn, audit)
            concepts = ConceptIndex(conn.execute("SELECT id, name FROM concepts").fetchall())
            if audit is not None:
                next_id = max(last_timestep_id(conn), audit.last_timestep_id()) + 1
                writer = Writer(conn, audit, concepts, next_id=next_id, batch_rows=config.batch_rows,
                                max_latency_s=config.max_latency_s, max_queue_rows=config.max_queue_rows,
                                submit_timeout_s=config.submit_timeout_s, on_commit=on_commit, k=TOP_K)
        except BaseException:
            if audit is not None:
                audit.close()
            conn.close()
            raise
        xdb = cls(data_dir, conn, audit, concepts, writer, config, summarize)
        if audit is not None:
            audit.verify_in_background()  # the start verified the log's tail; the rest is re-hashed meanwhile
        if config.backend == "ducklake" and not read_only:
            try:
                xdb.lake = Lake.open(config.lake, conn, audit.conn if audit is not None else None,
                                     threads=config.threads, on_tombstone=xdb._apply_tombstone)
                xdb.lake.start()
            except BaseException:
                xdb.close()
                raise
        return xdb

    def close(self) -> None:
        """Flush and commit everything queued, then close both files."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            try:
                if self.lake is not None:
                    self.lake.close()  # after the writer's last commit: its rows go in the last ship
            finally:
                if self.audit is not None:
                    self.audit.close()
                self.conn.close()

    def __enter__(self) -> XDB:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @service_after_flush
    def backup(self, dest: Path | str) -> dict[str, Any]:
        """A consistent copy of the database while it is written: `dest` becomes a data directory
        `XDB.open` (or `ahc serve --data-dir`) takes as it is. The experience file is copied first, from
        one snapshot, then the audit log between two commits; a row the audit holds and the copy missed
        is replayed from the audit when the copy is opened, as after a crash. Session RAG indexes are
        not copied: they are rebuilt from the Codex on the next RAG request."""
        dest = Path(dest)
        if dest.exists() and any(dest.iterdir()):
            raise ValueError(f"backup destination {dest} is not empty")
        if self.audit is None:
            raise ValueError("this XDB was opened read-only; back up its files with the server stopped instead")
        private_dir(dest)
        private_dir((dest / AUDIT_FILE).parent)
        with self._compress_lock, self.cursor() as cur:  # no seal or rewrite between the copy and its segments
            copy_database(self.conn, dest / EXPERIENCE_FILE)
            segments.link_into(cur, dest)
        with closing(duckdb.connect(str(dest / EXPERIENCE_FILE))) as copy:
            segments.refresh_view(copy)
        seq = self.audit.copy_to((dest / AUDIT_FILE).parent)
        private_tree(dest)
        return {"path": str(dest), "audit_seq": seq}

    @service_after_flush
    def export(self, out: Path | str | None = None, fmt: export.Format = "parquet", *, session_id: str | None = None,
               since: str | None = None, owner: str) -> dict[str, Any]:
        """Rows as Parquet (or JSON lines) files partitioned by session, and a manifest; `out`
        defaults to DATA_DIR/exports/<export id>. `since`: an ISO time (UTC), rows created from then
        on; `owner`: one tenant's sessions and documents (xdb/owner.py). The export is an audit event."""
        if self.writer is not None and self.writer.queue_depth():
            self.writer.flush()  # rows accepted before the export are in it
        export_id = f"exp-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{os.urandom(3).hex()}"
        dest = Path(out) if out is not None else self.data_dir / "exports" / export_id
        filters = export.ExportFilter(session_id, parse_since(since), owner=owner)
        with self.cursor() as cur:
            result = export.export_rows(cur, dest, fmt, filters, self.audit_head(), export_id)
        self.audit_event("export", {"id": result.id, "path": str(dest), "rows": result.manifest["rows"],
                                    "session_id": session_id, "since": since, "prefix": owner})
        return {**result.manifest, "path": str(dest), "bytes": export.export_bytes(result.manifest)}

    @service
    def capture_activations(self, address: str, k: int, wait_s: float) -> None:
        """Join the engine's activations, sent to the side channel at `address`, to the token rows
        recorded from now on (Writer.capture_activations)."""
        if self.writer is None:
            raise ValueError("capture_activations: this XDB is open read-only")
        self.writer.capture_activations(address, k, wait_s)

    @service
    def decode_tokens_with(self, tokenizer: str) -> None:
        """Decode the texts of token batches recorded with ids alone, from now on, with this tokenizer (a
        fast tokenizer's `backend_tokenizer.to_str()`; Writer.decode_tokens_with)."""
        if self.writer is None:
            raise ValueError("decode_tokens_with: this XDB is open read-only")
        self.writer.decode_tokens_with(tokenizer)

    @service
    def activations_receiving(self) -> bool | None:
        """Whether the writer's side-channel receiver runs (None: no capture, or read-only)."""
        return None if self.writer is None else self.writer.activations_receiving()

    @service
    def exports(self, owner: str | None) -> list[dict[str, Any]]:
        """The exports under DATA_DIR/exports made for `owner` (a tenant's, xdb/owner.py; None: every tenant's),
        newest first (manifests only: files are not re-hashed), each with its `path` and `bytes`."""
        found = []
        for path in (self.data_dir / "exports").glob(f"*/{export.MANIFEST}"):
            manifest = json.loads(path.read_text())
            if owner is None or manifest.get("prefix", EVERY) == owner:
                found.append({**manifest, "path": str(path.parent), "bytes": export.export_bytes(manifest)})
        # By the time each was made (to the microsecond): ids made in the same second sort at random.
        return sorted(found, key=lambda m: (export.created_at(m), m["id"]), reverse=True)

    @service
    def delete_export(self, export_id: str, owner: str, reason: str = "deleted") -> bool:
        """Remove one of the tenant's exports (its files and manifest); False if it has none of that
        id. The removal is an audit event."""
        for found in self.exports(owner):
            if found["id"] == export_id:
                shutil.rmtree(found["path"])
                self.audit_event("export_deleted", {"id": export_id, "prefix": owner, "bytes": found["bytes"],
                                                    "reason": reason})
                return True
        return False

    def expire_exports(self, ttl_s: float, over_bytes: int | None = None) -> tuple[list[str], int]:
        """Delete every export older than `ttl_s`, then, while the exports hold more than `over_bytes`
        (None: no limit), the oldest: they are copies, and go before any recorded row is compressed.
        Returns the deleted ids and the bytes the exports kept hold."""
        deleted = []
        now = dt.datetime.now(dt.UTC)
        kept = []
        for found in self.exports(None):
            if (now - export.created_at(found)).total_seconds() > ttl_s:
                self.delete_export(found["id"], found.get("prefix", EVERY), "expired")
                deleted.append(found["id"])
            else:
                kept.append(found)
        held = sum(found["bytes"] for found in kept)
        while over_bytes is not None and kept and held > over_bytes:
            oldest = kept.pop()
            self.delete_export(oldest["id"], oldest.get("prefix", EVERY), "over quota")
            deleted.append(oldest["id"])
            held -= oldest["bytes"]
        return deleted, held

    @classmethod
    def import_export(cls, data_dir: Path | str, src: Path | str) -> dict[str, Any]:
        """Load an export (`XDB.export`, `ahc xdb export`) into the XDB at `data_dir`, created if new
        and empty otherwise (stopped: this takes its files). Every file is checked against the
        manifest's SHA-256 first; the import is an audit event of the new XDB."""
        data_dir, src = Path(data_dir), Path(src)
        cls.open(data_dir).close()  # created and migrated, its audit log opened once
        conn = open_experience(data_dir / EXPERIENCE_FILE)
        try:
            manifest, loaded = export.import_rows(conn, src)
        finally:
            conn.close()
        with cls.open(data_dir) as xdb:
            xdb.audit_event("import", {"from": str(src), "export_id": manifest["id"], "rows": loaded,
                                       "source_audit_head": manifest["audit_head"]})
        return {"export_id": manifest["id"], "rows": loaded, "data_dir": str(data_dir)}

    def cursor(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return sql.cursor(self.conn)

    # -- the generic entry (xdb/interface.py) -----------------------------------------------------
    @service
    def read(self, fn: Callable[Concatenate[Cursor, P], R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn(cur, *args, **kwargs)` on a cursor of its own: a read function of XDB's modules (`@reads`),
        e.g. `xdb.read(list_documents, "codex", owner=EVERY)`."""
        check_entry(fn, "read")
        with self.cursor() as cur:
            return fn(cur, *args, **kwargs)

    @service
    def write(self, fn: Callable[Concatenate[Cursor, AuditEvent | None, P], R], /, *args: P.args,
              **kwargs: P.kwargs) -> R:
        """`fn(cur, audit, *args, **kwargs)`, one write at a time: a write function of XDB's modules
        (`@writes`), given the audit log's event hook (None when opened read-only, where nothing is written)."""
        check_entry(fn, "write")
        with self._write_lock, self.cursor() as cur:
            try:
                return fn(cur, self.audit_event if self.audit is not None else None, *args, **kwargs)
            finally:
                if self.writer is not None:  # e.g. a tag made a bud is no concept tag to auto-tag with
                    self.writer.invalidate_auto_tags()

    # -- recording -----------------------------------------------------------------------------
    @service
    def committed_tick(self, session_id: str) -> int:
        """The last tick the file holds for a session (-1: none): one primary-key lookup. In ducklake
        mode at least the lake's last tick for it, as learnt when its State was loaded."""
        with self.cursor() as cur:
            row = cur.execute("SELECT last_tick FROM session_ticks WHERE session_id = ?", [session_id]).fetchone()
        local = int(row[0]) if row else -1
        return local if self.lake is None else max(local, self._lake_ticks.get(session_id))

    @service
    def audit_event(self, action: str, details: dict[str, Any]) -> None:
        """Chain a system event (a deletion or rewrite of stored rows) in the audit log; what
        deletes calls this inside its transaction, before COMMIT. Read-only: nothing can be deleted."""
        if self.audit is not None:
            self.audit.append_event(action, details)

    # -- reading -------------------------------------------------------------------------------
    @service
    def recall(self, filters: RecallFilters | dict[str, Any] | None = None, *, owner: str,
               **kwargs: Any) -> list[dict[str, Any]]:
        """Timesteps matching the filters, oldest first, of the sessions `owner` owns (xdb/owner.py);
        a bad filter raises RecallFilterError (a ValueError) naming it."""
        f = RecallFilters.parse(filters, **kwargs)
        with self.cursor() as cur:
            return recall(cur, f, self.concepts, self.tag_cache, owner=owner)

    @service
    def recall_page(self, filters: RecallFilters | dict[str, Any] | None = None, *, owner: str,
                    **kwargs: Any) -> dict[str, Any]:
        """One page of recall: its rows, whether more follow, the cursor (`after_id`) for the next, and
        whether the page is `partial`: `recall_deadline_s` came before it was full. A partial page holds
        every match up to its cursor (where the scan stopped), so paging on from it skips nothing."""
        f = RecallFilters.parse(filters, **kwargs)
        with self.cursor() as cur:
            found = recall_within(cur, f.model_copy(update={"limit": f.limit + 1}), self.concepts, self.tag_cache,
                                  owner=owner, deadline_s=self.recall_deadline_s)
        rows = found.rows
        page = rows[:f.limit]
        if found.partial:
            return {"data": page, "has_more": True, "next_after_id": found.scanned_to, "partial": True}
        return {"data": page, "has_more": len(rows) > f.limit,
                "next_after_id": page[-1]["id"] if len(rows) > f.limit else None, "partial": False}

    @service
    def timestep(self, timestep_id: int, owner: str) -> dict[str, Any]:
        with self.cursor() as cur:
            found = timestep(cur, timestep_id, self.concepts, self.tag_cache, owner)
        if found is None:
            raise NotFound(f"timestep {timestep_id} not found")
        return found

    @service
    def surprising(self, session_id: str, limit: int = 20) -> list[dict[str, Any]]:
        with self.cursor() as cur:
            return insights.surprising(cur, session_id, self.concepts, limit)

    @service
    def related_concepts(self, concept: str, limit: int = 10, session_id: str | None = None,
                         relation: relations.Relation | None = None, *, owner: str) -> list[dict[str, Any]]:
        with self.cursor() as cur:
            return relations.related_concepts(cur, concept, self.concepts, limit, session_id, relation, owner=owner)

    @service
    def top_tokens(self, concept: str, owner: str, limit: int = 50) -> list[dict[str, Any]]:
        with self.cursor() as cur:
            return browse.top_tokens(cur, concept, self.concepts, owner, limit)

    @service
    def concepts_list(self, query: str | None = None, parent: str | None = None) -> list[dict[str, Any]]:
        """Concepts (name contains `query`; children of `parent`, "" for the top level)."""
        with self.cursor() as cur:
            found = tags.list_concepts(cur, query)
        if parent is None:
            return found
        return [c for c in found if (c["parent"] or "") == parent]

    @service
    def register_concepts(self, concepts: list[dict[str, Any]], source: str = "lens") -> None:
        """A lens pack's concepts and hierarchy ({"id", "name", "parent"} each)."""
        with self.cursor() as cur:
            tags.register_concepts(cur, concepts, source, self.audit_event)
        self._arm_auto_tags()

    def _arm_auto_tags(self) -> None:
        """Auto-tag at write time while any concept has a threshold (a FLOAT compares to the activations
        as they are stored); each batch that tags something makes recall reload the tag list."""
        if self.writer is None:
            return
        with self.cursor() as cur:
            rows = cur.execute("SELECT concept, threshold FROM concept_hierarchy "
                               "WHERE threshold IS NOT NULL").fetchall()
        self.writer.on_auto_tags = self.tag_cache.invalidate
        self.writer.set_auto_tag_thresholds({name: float(t) for name, t in rows})

    # -- tags and comments ---------------------------------------------------------------------
    def _target(self, cur: duckdb.DuckDBPyConnection, owner: str, **where: Any) -> tags.TagTarget:
        target = tags.make_target(**where)
        try:
            return tags.resolve_target(cur, target, owner)
        except NotFound:
            # The row may still be on the writer's queue: commit it and look again.
            if self.writer is None or self.writer.queue_depth() == 0:
                raise
            self.writer.flush(timeout=10)
            return tags.resolve_target(cur, target, owner)

    @service_after_flush
    def tag(self, tag: str | int, *, timestep_id: int | None = None, session_id: str | None = None,
            tick: int | None = None, event_id: str | None = None, tick_range: tuple[int, int] | None = None,
            tag_type: str = "custom", confidence: float = 1.0, source: str = "manual", note: str | None = None,
            created_by: str = "be", description: str | None = None, entity_type: str | None = None,
            owner: str) -> dict[str, Any]:
        """Apply a tag (a str is its name, an int its id; a new name creates it) to a timestep, an
        event or a tick range. Raises NotFound for a missing target, or one of a session `owner` does
        not own (xdb/owner.py)."""
        with self.cursor() as cur:
            target = self._target(cur, owner, timestep_id=timestep_id, session_id=session_id, tick=tick,
                                  event_id=event_id, tick_range=tick_range)
            try:
                with transaction(cur):
                    found = tags.get_or_create_tag(cur, tag, tag_type=tag_type, created_by=created_by,
                                                   description=description, entity_type=entity_type)
                    applied = tags.apply_tag(cur, found, target, confidence=confidence, source=source, note=note)
                    self.audit_event("tag_applied", {
                        "application_id": applied["id"], "tag_id": found["id"], "tag": found["name"],
                        "session_id": target.session_id, **_where(target), "source": source,
                        "confidence": confidence, "note_sha256": digest(note)})
                return applied
            finally:
                self._tags_changed()

    @service_after_flush
    def comment(self, content: str, *, timestep_id: int | None = None, session_id: str | None = None,
                tick: int | None = None, event_id: str | None = None,
                tick_range: tuple[int, int] | None = None, owner: str) -> dict[str, Any]:
        with self.cursor() as cur:
            target = self._target(cur, owner, timestep_id=timestep_id, session_id=session_id, tick=tick,
                                  event_id=event_id, tick_range=tick_range)
            with transaction(cur):
                added = tags.add_comment(cur, content, target)
                self.audit_event("comment_added", {"comment_id": added["id"], "session_id": target.session_id,
                                                   **_where(target), "sha256": digest(content)})
            return added

    @service
    def create_tag(self, name: str, tag_type: str = "custom", **fields: Any) -> dict[str, Any]:
        with self.cursor() as cur:
            try:
                return tags.get_or_create_tag(cur, name, tag_type=tag_type, **fields)
            finally:
                self._tags_changed()

    def _tags_changed(self) -> None:
        """Tags may have been made or changed: recall's tag list and the writer's auto-tag map reload."""
        self.tag_cache.invalidate()
        if self.writer is not None:
            self.writer.invalidate_auto_tags()

    # -- documents -----------------------------------------------------------------------------
    @service
    def add_document(self, name: str, content: str, *, owner: str, **fields: Any) -> dict[str, Any]:
        with self.cursor() as cur:
            return documents.add_document(cur, name, content, max_bytes=self.max_document_bytes, owner=owner,
                                          **fields)

    @service
    def update_document(self, doc_id: str, content: str, **fields: Any) -> dict[str, Any]:
        with self._documents_lock, self.cursor() as cur:
            return documents.update_document(cur, doc_id, content, max_bytes=self.max_document_bytes, **fields)

    # -- fidelity and compression ----------------------------------------------------------------
    @service_after_flush
    def pin(self, session_id: str, tick_from: int, tick_to: int, reason: str | None = None) -> dict[str, Any]:
        if self.writer is not None and self.writer.queue_depth():
            self.writer.flush()  # a session still on the writer's queue is one that exists
        with self.cursor() as cur, transaction(cur):
            window = fidelity.pin(cur, session_id, tick_from, tick_to, reason, self.warm_quota_bytes)
            self.audit_event("window_pinned", {"window_id": window["id"], "session_id": session_id,
                                               "ticks": [tick_from, tick_to], "reason_sha256": digest(reason)})
            return window

    def audit_bytes(self) -> int:
        """What the audit log's files take on disk (its database, log and anchored heads)."""
        folder = self.data_dir / AUDIT_FILE.parent
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) if folder.is_dir() else 0

    @service
    def state(self) -> dict[str, Any]:
        audit_bytes = self.audit_bytes()
        with self.cursor() as cur:
            counts = one(cur.execute("""SELECT (SELECT count(*) FROM timesteps), (SELECT count(*) FROM session_ticks),
                (SELECT count(*) FROM tags), (SELECT count(*) FROM tags WHERE tag_type = 'bud'),
                (SELECT count(DISTINCT id) FROM documents), (SELECT count(*) FROM comments),
                (SELECT count(*) FROM compaction_records), (SELECT count(*) FROM concepts)"""))
            return {
                "timesteps": counts[0], "sessions": counts[1], "tags": counts[2], "buds": counts[3],
                "documents": counts[4], "comments": counts[5], "compactions": counts[6], "concepts": counts[7],
                "fidelity": fidelity.fidelity_counts(cur, self.hot_seconds),
                "usage_bytes": compression.usage_bytes(cur) + audit_bytes, "audit_bytes": audit_bytes,
                "quota_bytes": self.quota_bytes, "export_bytes": sum(e["bytes"] for e in self.exports(None)),
                "warm_quota_bytes": self.warm_quota_bytes, "pinned_bytes": fidelity.pinned_bytes(cur),
                "writer": None if self.writer is None else {
                    "queue_depth": self.writer.queue_depth(), "rows_written": self.writer.rows_written},
                **({"lake": self.lake.status()} if self.lake is not None else {}),
            }

    # -- the discovery agent's run reports ------------------------------------------------------
    @service
    def save_run_report(self, run_id: str, png: bytes, owner: str) -> dict[str, Any]:
        """Store a run's report PNG as a document (a new version per call; InvalidRequest if `png` is
        not a PNG or is over runs.REPORT_MAX_BYTES); returns the document without content."""
        with self._documents_lock, self.cursor() as cur:
            doc = runs.save_report(cur, run_id, png, owner)
        return {k: v for k, v in doc.items() if k != "content"}

    # -- the audit (over HTTP to an auditor's key alone) --------------------------------------------------
    @service_after_flush
    def verify_audit(self, seq_from: int | None = None, seq_to: int | None = None) -> AuditReport:
        if self.audit is None:
            raise ValueError("this XDB was opened read-only; use xdb.audit.verify_audit(data_dir)")
        if self.writer is not None:
            self.writer.flush()
        report = self.audit.verify(seq_from, seq_to)
        with self.cursor() as cur:
            return self.audit.check_activations(cur, report, seq_from, seq_to)

    @service_after_flush
    def audit_records(self, session_id: str | None = None, event_type: str | None = None,
                      since: dt.datetime | None = None, until: dt.datetime | None = None, after_seq: int = -1,
                      limit: int = 100) -> list[dict[str, Any]]:
        """The audit log's records in chain order, filtered by session, event type and time
        (`since` inclusive, `until` exclusive), from after `after_seq`: what an auditor reads."""
        if self.audit is None:
            raise ValueError("this XDB was opened read-only: the audit log is read by the server that writes it")
        return self.audit.records(session_id, event_type, since, until, after_seq, limit)

    @service
    def audit_verified(self) -> bool | None:
        """The verdict of the whole-chain verification a start runs in the background: None while it
        runs (or on a read-only XDB)."""
        report = self.audit.full_verification if self.audit is not None else None
        return None if report is None else report.ok

    @service
    def audit_head(self) -> tuple[int, str]:
        """The audit chain's last committed head, as anchored in audit/audit.head: (seq, hex hash);
        seq -1 for an empty log. Read-only, the head file's last line."""
        if self.audit is not None:
            return self.audit.audit_head()
        heads = read_heads(self.data_dir / AUDIT_FILE.parent / HEAD_FILE)
        seq, head = heads[-1] if heads else (-1, GENESIS)
        return seq, head.hex()


def parse_since(since: str | None) -> dt.datetime | None:
    """An ISO 8601 time (a date, or a time with or without an offset; none means UTC), as naive UTC."""
    if since is None:
        return None
    try:
        when = dt.datetime.fromisoformat(since.replace("Z", "+00:00"))
        return when.astimezone(dt.UTC).replace(tzinfo=None) if when.tzinfo else when
    except (ValueError, OverflowError):
        raise InvalidRequest(f"since: {since!r} is not an ISO 8601 time within the years 1 to 9999 "
                             "(e.g. 2026-11-23T10:00:00Z)", param="since") from None


def _where(target: tags.TagTarget) -> dict[str, Any]:
    """What a tag or comment was put on, as its audit event says it."""
    ticks = None if target.range_start is None else [target.range_start, target.range_end]
    return {"target_type": target.kind, "timestep_id": target.timestep_id, "event_id": target.event_id,
            "ticks": ticks}
