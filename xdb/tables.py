"""XDB's tables, each described once: whose rows it holds, what dates them, and where else they go.

Export (xdb/export.py), the shared lake (xdb/lake/schema.py, its tombstones included), retention's
deletions (xdb/storage/retention.py) and the agent's runs (xdb/runs.py) all take their tables from `TABLES`; a
table's columns are its DDL's (xdb/schema.py, xdb/audit/log.py), which the lake reads back from a migrated
file. tests/test_xdb_tables.py fails while a migrated file holds a table that has no entry here.

A plain data module: nothing here touches DuckDB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Where new timesteps are written: `timesteps` is a view over it and the sealed segments (xdb/storage/segments.py).
HOT_TIMESTEPS = "timesteps_hot"

# The owner columns: a session's rows, or (the discovery agent's tables) a run's.
SESSION = "session_id"
RUN = "run_id"

# How a table's rows are found for shipping (xdb/lake/shipper.py):
#   "id":    an id committed in id order (the one writer thread's; the audit's seq): watermark = last id
#   "seq":   an id from a sequence, taken by concurrent transactions that may commit out of order:
#            watermark = last id, plus the ids below it not seen yet (open gaps, rechecked for a while)
#   "keyed": rows named by `key` whose `identity` columns may change (or a key come back after a
#            delete): every row whose identity hash differs from the one last shipped goes again
# (DuckDB's rowid would follow commit order, but it restarts below rows already shipped once the
# table's last row groups are deleted and checkpointed.)
Mode = Literal["id", "seq", "keyed"]


@dataclass(frozen=True)
class LakeShipping:
    """How the shared lake takes a table's rows; its columns are the local table's."""

    mode: Mode
    order: str = "id"                     # modes id and seq: the id column
    key: tuple[str, ...] = ("id",)        # mode keyed: what names a row
    identity: tuple[str, ...] = ()        # mode keyed: the columns hashed to tell versions apart (all)


@dataclass(frozen=True)
class Table:
    name: str
    # The session (SESSION) or agent run (RUN) whose rows these are: deleted with it, partitioned by it in
    # exports and filtered by --session. None for rows that outlive a session (its tombstone, the audit log).
    session_column: str | None = None
    # Exports keep the rows from --since on by it; with a session column, a tombstone deletes the rows
    # up to its time by it. None: exported whole (the vocabulary), and kept by tombstones.
    time_column: str | None = None
    # A row's time here keeps its session from being deleted as idle by retention.
    activity_column: str | None = None
    export: bool = False
    id_column: str | None = None          # exported: a tenant's rows are the ids that start with its prefix
    sequence: str | None = None           # the sequence behind its id column, advanced on import
    sequence_column: str | None = None
    lake: LakeShipping | None = None      # shipped to the shared lake, and how
    audit: bool = False                   # in audit/audit.duckdb, not experience.duckdb
    stored_in: str | None = None          # a view: the table its new rows are inserted into

    @property
    def target(self) -> str:
        """The table an insert of its rows goes to."""
        return self.stored_in or self.name

    @property
    def dated(self) -> bool:
        """A tombstone deletes the session's rows of this table written up to its time."""
        return self.session_column == SESSION and self.time_column is not None

    @property
    def tombstoned(self) -> bool:
        """The lake's copies go with the tombstone too, on every replica."""
        return self.dated and self.lake is not None


# In export order (the order of an export's manifest and of import's counts).
TABLES: tuple[Table, ...] = (
    Table("concepts", export=True, lake=LakeShipping("id")),
    Table("concept_hierarchy", export=True, lake=LakeShipping("keyed", key=("concept",))),
    Table("tags", export=True, sequence="tag_ids", sequence_column="id", lake=LakeShipping("keyed")),
    Table("timesteps", SESSION, "created_at", "created_at", export=True, lake=LakeShipping("id"),
          stored_in=HOT_TIMESTEPS),
    # The last tick a session used: deleted with the session, but a tombstone from another replica
    # leaves it, so ticks recorded after the deletion continue past the deleted ones.
    Table("session_ticks", SESSION, export=True),
    Table("tag_applications", SESSION, "created_at", export=True, sequence="tag_application_ids",
          sequence_column="id", lake=LakeShipping("seq")),
    Table("comments", SESSION, "created_at", export=True, sequence="comment_ids", sequence_column="id",
          lake=LakeShipping("seq")),
    Table("time_windows", SESSION, "created_at", export=True, sequence="window_ids", sequence_column="id"),
    # A record's activity is the end of the span it summarises, not when it was made.
    Table("compressed_records", SESSION, "created_at", "end_time", export=True, sequence="compressed_ids",
          sequence_column="id"),
    Table("compaction_records", SESSION, "created_at", "created_at", export=True, sequence="compaction_ids",
          sequence_column="id", lake=LakeShipping("seq")),
    Table("session_states", SESSION, "created_at", "created_at", export=True,
          lake=LakeShipping("keyed", key=("session_id", "version"), identity=("sha256", "created_at"))),
    Table("stored_responses", SESSION, "created_at", "created_at", export=True),
    Table("response_items", SESSION, "created_at", export=True),
    Table("documents", None, "updated_at", export=True, id_column="id"),
    Table("interaction_log", RUN, "timestamp", export=True, sequence="turn_ids", sequence_column="turn_id",
          lake=LakeShipping("seq", order="turn_id")),
    Table("meta_knowledge", RUN, "created_at", export=True, sequence="knowledge_ids",
          sequence_column="version_id", lake=LakeShipping("seq", order="version_id")),
    Table("run_progress", RUN, "created_at", export=True, sequence="run_progress_ids",
          sequence_column="progress_id", lake=LakeShipping("seq", order="progress_id")),
    Table("run_attempts", RUN, "created_at", export=True, sequence="run_attempt_ids",
          sequence_column="attempt_id", lake=LakeShipping("seq", order="attempt_id")),
    Table("theorem_versions", RUN, "created_at", export=True, sequence="theorem_version_ids",
          sequence_column="version_id", lake=LakeShipping("seq", order="version_id")),
    Table("xdb_meta"),
    # The sealed segments of `timesteps`, their rows deleted since and their sessions
    # (xdb/storage/segments.py): the file's bookkeeping, as xdb_meta.
    Table("segments"),
    Table("segment_deletes"),
    Table("segment_sessions"),
    # Each evidence submission's bud (xdb/tags.py): the server's shared vocabulary, exported as the tags are.
    Table("bud_submissions", export=True),
    # The review step's proposals for Karma and their verdicts (xdb/karma_reviews.py): a session's own go
    # with it (a tenant's, with no session, stay); the audit log keeps who verified what by hash.
    # A review carries its proposal's session, so a tenant's export holds only its own sessions' reviews.
    Table("karma_proposals", SESSION, "created_at", export=True, sequence="karma_proposal_ids",
          sequence_column="id"),
    Table("karma_reviews", SESSION, "created_at", export=True, sequence="karma_review_ids", sequence_column="id"),
    # Shipped after the tables it deletes from: the lake's deletion then takes the rows of the same ship.
    Table("session_tombstones", sequence="tombstone_ids", sequence_column="id", lake=LakeShipping("seq")),
    Table("applied_tombstones"),
    Table("audit_records", audit=True, lake=LakeShipping("id", order="seq")),
    Table("audit_concepts", audit=True, lake=LakeShipping("id")),
    Table("audit_meta", audit=True),
    Table("audit_checkpoints", audit=True),
    # The activations of audited rows the experience file may not hold yet (xdb/audit/activations.py): a
    # write-ahead log's tail, never shipped.
    Table("audit_replay", audit=True),
    # Hidden concepts' activations (xdb/audit/hidden.py): the auditor's alone, never shipped.
    Table("audit_hidden", audit=True),
)
