"""XDB, the experience database: every timestep an agent lives through, in embedded DuckDB.

The interface the server uses:

    from xdb import XDB, TimestepRow, RecallFilters

    xdb = XDB.open(data_dir, config: XDBConfig | None = None, *, read_only=False, on_commit=None, summarize=None)
        # DATA_DIR/experience.duckdb + DATA_DIR/audit/audit.duckdb, migrated; a corrupt or foreign
        # file raises ValueError and is never reset. read_only=True opens for reading only.
        # ahc.config.XDBConfig holds the quotas, hot_seconds, max_document_bytes, the writer's
        # batch_rows / max_latency_s / max_queue_rows / submit_timeout_s, and DuckDB's threads.
    ticks = xdb.next_ticks(session_id, n)            # range of n ticks, no DB round trip
    xdb.writer.submit(rows: list[TimestepRow] | TokenBatch)  # non-blocking; blocks when full, raises WriterBackpressure
    await xdb.writer.asubmit(rows)                   # never blocks the event loop
    xdb.writer.try_submit(rows) -> bool              # False instead of waiting
        # TokenBatch(session_id, ticks, contents, token_ids=, request_id=, concept_names=,
        #            concept_index=[n,k'] (-1 = empty), concept_values=[n,k'], ...): a reply's tokens
        #            column-wise, the fast path (no Python object a token); see xdb/rows.py
    xdb.writer.flush(timeout=None)                   # everything submitted so far committed (audit + experience)
    xdb.writer.queue_depth() -> int; xdb.writer.rows_written; xdb.writer.on_commit = fn(n_rows)
    xdb.close()                                      # flushes, then closes both files

    xdb.recall(RecallFilters | dict | **filters) -> list[dict]   # timestep fields + role, token_id, request_id
    xdb.recall_page(filters) -> {"data", "has_more", "next_after_id"} ; xdb.timestep(id)  # with tags, comments
    xdb.surprising(session_id, limit) ; xdb.related_concepts(concept, limit, session_id=)  # xdb/insights.py
    xdb.tag(tag, timestep_id= | session_id=+tick= | event_id= | session_id=+tick_range=, ...)
                                                     # tag (and bud): a str is a name, an int an id
    xdb.comment(content, <same target>) ; xdb.comments(session_id)
    xdb.concepts_list(query) ; xdb.buds(status) ; xdb.set_bud_status(tag, status) ; xdb.create_tag(name, type)
    xdb.documents(doc_type, query) ; xdb.document(doc_id | path=, version=) ; xdb.document_versions(doc_id)
    xdb.add_document(name, content, doc_type=, path=, tags=, source=, summary=) ; xdb.update_document(doc_id, content)
    xdb.pin(session_id, tick_from, tick_to, reason) ; xdb.unpin(window_id) ; xdb.windows(session_id)
    xdb.submit_evidence(bud, submission_id) ; xdb.resolve_submission(submission_id, accepted)
    xdb.compact(session_id=None, up_to_tick=, summary=, trigger=, compress_released=) ; xdb.cold_records()
    xdb.state() -> dict
    xdb.save_session_state(session_id, state_json) -> version ; xdb.load_session_state(session_id) -> str | None
    xdb.log_interaction(run_id, journal_entry=, tool_call_json=, tool_result_json=, token_count=) -> turn_id
    xdb.interactions(run_id, pattern=, after_turn=, last=)
    xdb.save_meta_knowledge(run_id, ...) ; xdb.meta_knowledge(run_id)
    xdb.purge_run(run_id) -> {"interaction_log": n, "meta_knowledge": n}   # deletes one run's rows
    xdb.runs(prefix, limit) ; xdb.save_run_report(run_id, png) ; xdb.run_report(run_id) -> bytes | None
    xdb.sessions_overview(prefix, limit, query) ; xdb.session_turns(session_id) ; xdb.top_tokens(concept, prefix)
        # what the experience browser reads (xdb/browse.py): a turn is the server's `system` row with
        # metadata {"turn": {cache report + usage}} written after each reply, and the rows before it
    xdb.verify_audit() / xdb.audit.verify_audit(data_dir) -> AuditReport(ok, records_checked, first_bad)
    xdb.audit_head() -> (seq, hex hash)            # the last head, as anchored in audit/audit.head
    xdb.export(out=None, fmt="parquet"|"jsonl", session_id=, since=, prefix=) -> manifest
        # Parquet partitioned by session (JSON lines in the same layout) + manifest.json; xdb/export.py
    xdb.exports(prefix) -> [manifest]                # DATA_DIR/exports/*, newest first
    XDB.import_export(data_dir, src) -> {"export_id", "rows"}   # into a new or empty XDB, files checked
    xdb.find_document(key | path=, version=, sha256=, id_prefix=, with_content=)  # by id, name or hash
    xdb.audit_event(action, details)                # chain a deletion/rewrite (before its COMMIT)

    RemoteXDB(data_dir, config, on_commit=, on_restart=)  # the same, with the files, the writer and the
        # audit in a process of their own (xdb/service.py); what `ahc serve` uses

    The shared lake, `xdb.backend: ducklake` (xdb/lake.py; config xdb.lake: catalog, data_path,
    replica_id, ship_interval_s, ship_batch_rows): the files above stay each replica's local buffer,
    and a shipper thread copies what they commit into one DuckLake (catalog in PostgreSQL, Parquet
    under data_path) every ship_interval_s, every row with its `replica`, exactly once.
    xdb.lake                                         # None with the duckdb backend (or read-only)
    xdb.lake_ship_now() -> {table: rows}             # flush, then ship everything now
    xdb.lake_recall(filters | **filters)             # every replica's timesteps (no after_id; + `replica`)
    xdb.lake_concepts(query) ; xdb.lake_tags(tag_type) ; xdb.lake_status()
    xdb.verify_lake_audit() -> {replica: AuditReport}   # every replica's chain in the lake, recomputed
    (xdb.lake.recall / concepts / tags / ship_now / status / verify_audit: the same; RemoteXDB too)
        # save_session_state ships the State (with every row committed before it) before it returns,
        # or raises LakeUnavailable (stored locally all the same); load_session_state returns the newest
        # State of any replica and moves the session's ticks past every replica's.
        # server.cluster.catalog.LocalPostgres: a local catalog.

Errors: RecallFilterError (ValueError, .param), tags.NotFound (LookupError), DocumentTooLarge
(ValueError), fidelity.QuotaExceeded (ValueError), WriterBackpressure (TimeoutError), WriterStopped,
lake.LakeUnavailable (Unavailable: the lake cannot be reached now; nothing local is lost).
Every read runs on its own cursor of the writer's connection, so any thread may call them.
"""

from typing import TYPE_CHECKING, TypeAlias

from ahc.errors import NotFound
from xdb.audit import AuditReport, verify_audit
from xdb.documents import DocumentTooLarge, DocumentType
from xdb.fidelity import CompressionLevel, Fidelity, QuotaExceeded
from xdb.recall import RecallFilterError, RecallFilters
from xdb.remote import RemoteXDB
from xdb.rows import TimestepRow, TokenBatch
from xdb.store import XDB
from xdb.tags import BudStatus, TagType
from xdb.writer import WriterBackpressure, WriterStopped

# What the server holds: the database in its own process (RemoteXDB, `ahc serve`'s default) or in this one.
# RemoteXDB serves XDB's own interface (the methods XDB marks, xdb/interface.py), so the type checker
# reads every call through XDB's signatures.
if TYPE_CHECKING:
    XDBClient: TypeAlias = XDB
else:
    XDBClient = XDB | RemoteXDB

__all__ = ["XDB", "RemoteXDB", "XDBClient",
           "TimestepRow", "TokenBatch", "RecallFilters", "RecallFilterError", "AuditReport", "verify_audit",
           "NotFound", "DocumentTooLarge", "DocumentType", "QuotaExceeded", "Fidelity", "CompressionLevel", "BudStatus",
           "TagType", "WriterBackpressure", "WriterStopped"]
