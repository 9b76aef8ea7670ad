"""XDB, the experience database: every timestep an agent lives through, in embedded DuckDB.

    from xdb import XDB, TimestepRow, RecallFilters
    from xdb.documents import list_documents

    xdb = XDB.open(data_dir, config: XDBConfig | None = None, *, read_only=False, on_commit=None, summarize=None)
        # DATA_DIR/experience.duckdb + DATA_DIR/audit/audit.duckdb, migrated; a corrupt or foreign
        # file raises ValueError and is never reset. core.config.XDBConfig holds the quotas, the
        # writer's batching and bounds, DuckDB's threads and the lake.
    ticks = xdb.next_ticks(session_id, n)            # range of n ticks, no DB round trip
    xdb.writer.submit(rows: list[TimestepRow] | TokenBatch)  # non-blocking; raises WriterBackpressure when full
    xdb.decode_tokens_with(tokenizer_json)  # a TokenBatch may then bring token ids without texts: decoded
        # by the writer (xdb/token_decoder.py), in the service process under `ahc serve`
    await xdb.writer.asubmit(rows) ; xdb.writer.flush(timeout=None) ; xdb.close()

    xdb.read(fn, *args, **kwargs)     # a read function of XDB's modules (marked @reads): fn(cur, *args, **kwargs)
    xdb.write(fn, *args, **kwargs)    # a write function (marked @writes), one at a time: fn(cur, audit, ...)
        # e.g. xdb.read(list_documents, "codex", owner=EVERY) ; xdb.write(log_interaction, run_id, journal_entry="...")

XDB's methods (xdb/store.py, with those on sessions and the lake in xdb/store_sessions.py and
xdb/store_lake.py) are the rest of its interface: those that add something of their own to a module
function (recall and its pages, tagging, documents with their size limit, pins, compaction, State with
the lake, exports, the audit). The methods marked `@service` there, and `read` / `write`, are what
`RemoteXDB(data_dir, config, on_commit=, on_restart=)` serves from a process of its own (xdb/service/service.py;
what `ahc serve` uses); xdb/interface.py says how.

With `xdb.backend: ducklake` (xdb/lake/lake.py) the files stay each replica's local buffer and a shipper
thread copies what they commit into one DuckLake (catalog in PostgreSQL, Parquet under data_path),
every row with its `replica`, exactly once; `lake_recall`, `lake_concepts`, `lake_tags`, `lake_status`,
`lake_ship_now` and `verify_lake_audit` read and ship it. `save_session_state` ships the State before it
returns (or raises LakeUnavailable, stored locally all the same); `load_session_state` returns the newest
State of any replica and moves the session's ticks past every replica's.

Layout. Five rooms, each a subpackage with a README, stand in layers (an import-linter contract):
    xdb/service/   the service process, its link, RemoteWriter and RemoteXDB          (over the store)
    xdb/lake/      the shared lake: tables, shipper, purges, cluster-wide reads        (under the store)
    xdb/recall/    recall's filters and queries, the browser's reads, insights
    xdb/storage/   fidelity tiers, compression, retention, sealed segments, vacuum, backups
    xdb/audit/     the audit log: the chain, its keys and seals, verification
The core stays here at the top of the package, in two parts the rooms sit between: XDB's base, which
every room stands on (schema.py, tables.py, sql.py, rows.py, concepts.py, owner.py, private.py,
interface.py, checkpoints.py, ticks.py), and the store, which puts the rooms together (store.py and its
methods in store_sessions.py, store_lake.py, store_storage.py; the writer; tags, documents, runs, ...).
One `core/` room holding both would sit both under and over every other room. cli.py and backup_erase.py
open a whole XDB, offline, and stand above the store.

Errors: RecallFilterError (ValueError, .param), NotFound (LookupError), DocumentTooLarge (ValueError),
QuotaExceeded (ValueError), WriterBackpressure (TimeoutError), WriterStopped, LakeUnavailable (the lake
cannot be reached now; nothing local is lost). Every read runs on its own cursor of the writer's
connection, so any thread may call them.
"""

from typing import TYPE_CHECKING, TypeAlias

from core.errors import NotFound
from xdb.audit.log import verify_audit
from xdb.audit.verify import AuditReport
from xdb.documents import DocumentTooLarge, DocumentType
from xdb.recall.recall import RecallFilterError, RecallFilters
from xdb.rows import TimestepRow, TokenBatch
from xdb.service.remote_xdb import RemoteXDB
from xdb.storage.fidelity import CompressionLevel, Fidelity, QuotaExceeded
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
