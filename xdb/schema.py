"""The experience database's tables and their versioned migrations.

A file is ours when its `xdb_meta` says `app = ahc-xdb`; anything else (another program's DuckDB file,
bytes that are not DuckDB at all, a newer schema) is refused with a ValueError and never reset.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from xdb.sql import transaction
from xdb.tables import HOT_TIMESTEPS

APP = "ahc-xdb"
# Top-k concept activations kept per timestep. Fixed-size ARRAY columns insert ~1.6x faster than
# LISTs (measured), so k is part of the schema; a row with fewer than k has NULL slots.
# Ids, ticks and counts are DuckDB BIGINTs: a larger integer is refused as bad input, not a database error.
INT64_MAX = 2**63 - 1
# The few INTEGER columns a client writes directly (interaction_log.token_count) take a 32-bit value.
INT32_MAX = 2**31 - 1

TOP_K = 10

# Each migration is (version, statements); they run in order, each in one transaction, and
# `schema_version` records the last one applied. Never edit a released migration: add a new one.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        "CREATE TABLE xdb_meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
        "CREATE TABLE concepts (id INTEGER PRIMARY KEY, name VARCHAR NOT NULL UNIQUE)",
        # No primary key or index: an ART index halves the insert rate; ids come from the one writer
        # in ascending order, so DuckDB's zone maps already prune id and tick ranges.
        f"""CREATE TABLE timesteps (
            id BIGINT NOT NULL, session_id VARCHAR NOT NULL, tick BIGINT NOT NULL,
            event_type VARCHAR NOT NULL, role VARCHAR, content VARCHAR, token_id INTEGER,
            request_id VARCHAR, concept_ids INTEGER[{TOP_K}], concept_values FLOAT[{TOP_K}],
            activation_source VARCHAR, created_at TIMESTAMP NOT NULL, metadata VARCHAR)""",
        # The last tick each session used, so ticks resume after a restart even once the rows
        # themselves have been compressed away.
        "CREATE TABLE session_ticks (session_id VARCHAR PRIMARY KEY, last_tick BIGINT NOT NULL)",
        "CREATE SEQUENCE tag_ids START 1",
        """CREATE TABLE tags (
            id BIGINT PRIMARY KEY DEFAULT nextval('tag_ids'), name VARCHAR NOT NULL UNIQUE,
            tag_type VARCHAR NOT NULL, concept_id VARCHAR, entity_type VARCHAR, bud_status VARCHAR,
            created_at TIMESTAMP NOT NULL, created_by VARCHAR NOT NULL, description VARCHAR)""",
        "CREATE SEQUENCE tag_application_ids START 1",
        """CREATE TABLE tag_applications (
            id BIGINT PRIMARY KEY DEFAULT nextval('tag_application_ids'), tag_id BIGINT NOT NULL,
            session_id VARCHAR, target_type VARCHAR NOT NULL, timestep_id BIGINT, event_id VARCHAR,
            range_start BIGINT, range_end BIGINT, confidence DOUBLE NOT NULL, source VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL, note VARCHAR)""",
        "CREATE SEQUENCE comment_ids START 1",
        """CREATE TABLE comments (
            id BIGINT PRIMARY KEY DEFAULT nextval('comment_ids'), session_id VARCHAR,
            target_type VARCHAR NOT NULL, timestep_id BIGINT, event_id VARCHAR, range_start BIGINT,
            range_end BIGINT, content VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL,
            updated_at TIMESTAMP)""",
        "CREATE SEQUENCE window_ids START 1",
        """CREATE TABLE time_windows (
            id BIGINT PRIMARY KEY DEFAULT nextval('window_ids'), session_id VARCHAR NOT NULL,
            start_tick BIGINT NOT NULL, end_tick BIGINT NOT NULL, start_time TIMESTAMP,
            end_time TIMESTAMP, fidelity VARCHAR NOT NULL, compression_level INTEGER NOT NULL,
            pinned BOOLEAN NOT NULL, pinned_reason VARCHAR, submission_ids VARCHAR[] NOT NULL,
            token_count BIGINT NOT NULL, bytes BIGINT NOT NULL, created_at TIMESTAMP NOT NULL)""",
        "CREATE SEQUENCE compressed_ids START 1",
        """CREATE TABLE compressed_records (
            id BIGINT PRIMARY KEY DEFAULT nextval('compressed_ids'), compression_level INTEGER NOT NULL,
            session_id VARCHAR, start_time TIMESTAMP NOT NULL, end_time TIMESTAMP NOT NULL,
            start_tick BIGINT, end_tick BIGINT, summary VARCHAR NOT NULL, top_k_activations VARCHAR NOT NULL,
            significant_tags VARCHAR[] NOT NULL, source_record_ids VARCHAR[] NOT NULL,
            token_count BIGINT NOT NULL, record_count BIGINT NOT NULL, created_at TIMESTAMP NOT NULL)""",
        "CREATE SEQUENCE compaction_ids START 1",
        """CREATE TABLE compaction_records (
            id BIGINT PRIMARY KEY DEFAULT nextval('compaction_ids'), session_id VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL, range_start BIGINT NOT NULL, range_end BIGINT NOT NULL,
            timesteps_compacted BIGINT NOT NULL, tokens_before BIGINT NOT NULL, tokens_after BIGINT NOT NULL,
            summary VARCHAR NOT NULL, summary_concept_tags VARCHAR[] NOT NULL,
            top_k_activations VARCHAR NOT NULL, trigger VARCHAR NOT NULL, result_level INTEGER NOT NULL)""",
        """CREATE TABLE documents (
            id VARCHAR NOT NULL, version INTEGER NOT NULL, doc_type VARCHAR NOT NULL, name VARCHAR NOT NULL,
            path VARCHAR, content VARCHAR NOT NULL, content_hash VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL, source VARCHAR,
            summary VARCHAR, tags VARCHAR[] NOT NULL, PRIMARY KEY (id, version))""",
        # The discovery agent's tables, with a run_id so several runs can share one store.
        "CREATE SEQUENCE turn_ids START 1",
        """CREATE TABLE interaction_log (
            turn_id BIGINT PRIMARY KEY DEFAULT nextval('turn_ids'), run_id VARCHAR NOT NULL,
            timestamp TIMESTAMP NOT NULL, journal_entry VARCHAR, tool_call_json VARCHAR,
            tool_result_json VARCHAR, token_count INTEGER)""",
        "CREATE SEQUENCE knowledge_ids START 1",
        """CREATE TABLE meta_knowledge (
            version_id BIGINT PRIMARY KEY DEFAULT nextval('knowledge_ids'), run_id VARCHAR NOT NULL,
            theorems_json VARCHAR, negative_knowledge VARCHAR, last_compacted_turn BIGINT,
            created_at TIMESTAMP NOT NULL)""",
        # The orchestrator's per-session State, versioned so an earlier state can be recovered.
        """CREATE TABLE session_states (
            session_id VARCHAR NOT NULL, version INTEGER NOT NULL, state_json VARCHAR NOT NULL,
            sha256 VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL, PRIMARY KEY (session_id, version))""",
    ]),
    (2, [
        # A lens pack's concepts: display names and the hierarchy /v1/xdb/concepts browses. Keyed by
        # the concept name timesteps use (concepts.name), known before any token has activated them.
        """CREATE TABLE concept_hierarchy (
            concept VARCHAR PRIMARY KEY, display_name VARCHAR NOT NULL, parent VARCHAR,
            source VARCHAR NOT NULL, updated_at TIMESTAMP NOT NULL)""",
    ]),
    (3, [
        # The activation at which a token gets the concept's tag automatically (NULL: never).
        "ALTER TABLE concept_hierarchy ADD COLUMN threshold FLOAT",
    ]),
    (4, [
        # A deleted session's mark: with the shared lake, every replica and every read drops the
        # session's rows written up to `deleted_at` (its State included), so a deletion sticks.
        "CREATE SEQUENCE tombstone_ids START 1",
        """CREATE TABLE session_tombstones (
            id BIGINT PRIMARY KEY DEFAULT nextval('tombstone_ids'), session_id VARCHAR NOT NULL,
            deleted_at TIMESTAMP NOT NULL, reason VARCHAR NOT NULL)""",
        # Other replicas' tombstones (as the lake names them) already applied to this file's rows.
        """CREATE TABLE applied_tombstones (
            replica VARCHAR NOT NULL, id BIGINT NOT NULL, session_id VARCHAR NOT NULL,
            deleted_at TIMESTAMP NOT NULL, applied_at TIMESTAMP NOT NULL, PRIMARY KEY (replica, id))""",
    ]),
    (5, [
        # The Responses API's stored responses (xdb/responses.py): read back by id, continued by
        # previous_response_id; each keeps the chat messages it added to its conversation.
        """CREATE TABLE stored_responses (
            id VARCHAR PRIMARY KEY, session_id VARCHAR NOT NULL, previous_id VARCHAR, kept BOOLEAN NOT NULL,
            conversation_json VARCHAR NOT NULL, response_json VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL)""",
        "CREATE INDEX stored_responses_session ON stored_responses (session_id)",
    ]),
    (6, [
        # The output items of each stored response by id, so that a later request may name one instead of
        # sending it again (the Responses API's `item_reference`); the items already stored are indexed.
        """CREATE TABLE response_items (
            item_id VARCHAR NOT NULL, response_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL)""",
        "CREATE INDEX response_items_item ON response_items (item_id)",
        """INSERT INTO response_items
            SELECT item_id, id, session_id, created_at FROM (
                SELECT unnest(json_extract_string(response_json, '$.output[*].id')) AS item_id, id, session_id,
                       created_at FROM stored_responses)
            WHERE item_id IS NOT NULL""",
    ]),
    (7, [
        # A stored response keeps only what it added to its conversation: a request that resends its
        # history references the earlier response of its session the history begins with (base_id,
        # base_messages), found by the digests of each response's input and conversation; state_sha
        # is the session's State once a continuation committed. Rows stored before keep NULLs: they
        # read as before, are never referenced, and a continuation of one forks a session.
        "ALTER TABLE stored_responses ADD COLUMN base_id VARCHAR",
        "ALTER TABLE stored_responses ADD COLUMN base_messages INTEGER",
        "ALTER TABLE stored_responses ADD COLUMN input_sha VARCHAR",
        "ALTER TABLE stored_responses ADD COLUMN conversation_sha VARCHAR",
        "ALTER TABLE stored_responses ADD COLUMN state_sha VARCHAR",
    ]),
    (8, [
        # New timesteps go to the hot table; the storage pass seals its rows into segment files
        # (xdb/storage/segments.py) and `timesteps` becomes the view every read takes, over both.
        f"ALTER TABLE timesteps RENAME TO {HOT_TIMESTEPS}",
        # content_bytes: its rows' text, which the quota counts without reading the file.
        """CREATE TABLE segments (
            name VARCHAR PRIMARY KEY, first_id BIGINT NOT NULL, last_id BIGINT NOT NULL, rows BIGINT NOT NULL,
            bytes BIGINT NOT NULL, created_at TIMESTAMP NOT NULL, content_bytes BIGINT NOT NULL)""",
        # A segment's rows deleted since it was written; `erase`: a session's deletion, whose text must
        # leave the file.
        """CREATE TABLE segment_deletes (
            id BIGINT NOT NULL, segment VARCHAR NOT NULL, erase BOOLEAN NOT NULL, content_bytes BIGINT NOT NULL)""",
        # The sessions each segment holds rows of: a session's deletion reads only those segments.
        "CREATE TABLE segment_sessions (segment VARCHAR NOT NULL, session_id VARCHAR NOT NULL)",
        f"CREATE VIEW timesteps AS SELECT * FROM {HOT_TIMESTEPS}",
    ]),
    # A bud's life (xdb/tags.py): candidate, ready (enough examples), submitted, then grafted or rejected;
    # the statuses before it map onto those. Each submission names its bud.
    (9, [
        "UPDATE tags SET bud_status = CASE bud_status WHEN 'collecting' THEN 'candidate' WHEN 'training' THEN "
        "'submitted' WHEN 'promoted' THEN 'grafted' WHEN 'abandoned' THEN 'rejected' ELSE bud_status END "
        "WHERE tag_type = 'bud'",
        """CREATE TABLE bud_submissions (
            submission_id VARCHAR PRIMARY KEY, tag_id BIGINT NOT NULL, submitted_at TIMESTAMP NOT NULL,
            resolved_at TIMESTAMP, accepted BOOLEAN)""",
    ]),
    # The discovery agent's history across runs (xdb/run_history.py): a run's progress after each turn
    # (the latest row is its outcome), every law or submission it tried with the verdict, and every
    # version of every theorem, linked to its parent.
    (10, [
        "CREATE SEQUENCE run_progress_ids START 1",
        """CREATE TABLE run_progress (
            progress_id BIGINT PRIMARY KEY DEFAULT nextval('run_progress_ids'), run_id VARCHAR NOT NULL,
            rule VARCHAR NOT NULL, strategy VARCHAR NOT NULL, strategy_json VARCHAR, status VARCHAR NOT NULL,
            turns INTEGER NOT NULL, tokens BIGINT NOT NULL, laws_tried INTEGER NOT NULL,
            laws_passed INTEGER NOT NULL, laws_failed INTEGER NOT NULL, theorems_stored INTEGER NOT NULL,
            theorems_retracted INTEGER NOT NULL, wall_s DOUBLE NOT NULL, created_at TIMESTAMP NOT NULL)""",
        "CREATE SEQUENCE run_attempt_ids START 1",
        """CREATE TABLE run_attempts (
            attempt_id BIGINT PRIMARY KEY DEFAULT nextval('run_attempt_ids'), run_id VARCHAR NOT NULL,
            rule VARCHAR NOT NULL, turn INTEGER NOT NULL, kind VARCHAR NOT NULL, subject VARCHAR NOT NULL,
            law_key VARCHAR, law_json VARCHAR, verdict VARCHAR NOT NULL, detail VARCHAR,
            created_at TIMESTAMP NOT NULL)""",
        "CREATE SEQUENCE theorem_version_ids START 1",
        """CREATE TABLE theorem_versions (
            version_id BIGINT PRIMARY KEY DEFAULT nextval('theorem_version_ids'), run_id VARCHAR NOT NULL,
            theorem_id VARCHAR NOT NULL, version INTEGER NOT NULL, parent_version INTEGER, change VARCHAR NOT NULL,
            turn INTEGER NOT NULL, reason VARCHAR, theorem_json VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL)""",
    ]),
    # What made each compressed record (xdb/storage/compression.py's TRIGGERS); NULL for those made before.
    (11, [
        "ALTER TABLE compressed_records ADD COLUMN trigger VARCHAR",
    ]),
    # The review step (xdb/karma_reviews.py): an outcome proposed for Karma, where it came from, and its
    # status; each verdict and retraction on it, by whom and why. `tenant`: the tenant's name.
    (12, [
        "CREATE SEQUENCE karma_proposal_ids START 1",
        """CREATE TABLE karma_proposals (
            id BIGINT PRIMARY KEY DEFAULT nextval('karma_proposal_ids'), tenant VARCHAR NOT NULL,
            scope VARCHAR NOT NULL, session_id VARCHAR, text VARCHAR NOT NULL, source_session_id VARCHAR,
            tick_start BIGINT, tick_end BIGINT, event_id VARCHAR, proposed_by VARCHAR NOT NULL,
            status VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL)""",
        "CREATE SEQUENCE karma_review_ids START 1",
        """CREATE TABLE karma_reviews (
            id BIGINT PRIMARY KEY DEFAULT nextval('karma_review_ids'), proposal_id BIGINT NOT NULL,
            session_id VARCHAR, action VARCHAR NOT NULL, reviewer VARCHAR NOT NULL, reviewer_kind VARCHAR NOT NULL,
            rationale VARCHAR, created_at TIMESTAMP NOT NULL)""",
    ]),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


class DatabaseInUse(ValueError):
    """Another process holds the file's lock (another server, or one still closing)."""


def connect_checked(path: Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB file, turning DuckDB's errors about foreign, corrupt or locked files into one
    clear ValueError that names the file."""
    if read_only and not path.exists():
        raise ValueError(f"{path} does not exist")
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        detail = " ".join(str(exc).split())
        # DuckDB's own words for a file another process holds ("Could not set lock on file ...: Conflicting
        # lock is held in ..."); a bare "lock" would also match an internal error's stack ("BlockManager").
        if "could not set lock" in detail.lower():
            raise DatabaseInUse(f"{path} is in use by another process: {detail}") from exc
        raise ValueError(f"{path} is not a usable DuckDB database (corrupt or foreign file); "
                         f"refusing to reset it: {detail}") from exc


def user_tables(conn: duckdb.DuckDBPyConnection) -> set[str]:
    rows = conn.execute("SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = 'main' AND table_catalog = current_database()").fetchall()
    return {name for (name,) in rows}


def stored_version(conn: duckdb.DuckDBPyConnection, path: Path, meta_table: str, app: str) -> int | None:
    """The schema version a file holds; None for a brand-new empty file. Raises on a foreign file."""
    tables = user_tables(conn)
    if not tables:
        return None
    if meta_table not in tables:
        raise ValueError(f"{path} is a DuckDB file of another program (no {meta_table} table); "
                         "refusing to use or reset it")
    meta = dict(conn.execute(f"SELECT key, value FROM {meta_table}").fetchall())
    if meta.get("app") != app:
        raise ValueError(f"{path} belongs to {meta.get('app')!r}, not {app!r}; refusing to use or reset it")
    return int(meta.get("schema_version", 0))


def migrate(conn: duckdb.DuckDBPyConnection, path: Path, migrations: list[tuple[int, list[str]]],
            meta_table: str, app: str, *, checkpoint: bool = False) -> int:
    """Bring a file up to the newest schema (checkpointed after with `checkpoint`); returns the version. A new
    file takes every migration in one transaction, an older one each missing migration in a transaction of
    its own: a commit costs more than the DDL it ends (a new data directory's two files took 60 ms, 34 now)."""
    current = stored_version(conn, path, meta_table, app)
    newest = migrations[-1][0]
    if current is not None and current > newest:
        raise ValueError(f"{path} has schema version {current}, newer than this AHC ({newest}); "
                         "upgrade AHC instead")
    start = current
    if current is None:
        with transaction(conn):
            for _, statements in migrations:
                for sql in statements:
                    conn.execute(sql)
            conn.execute(f"INSERT INTO {meta_table} VALUES ('app', ?)", [app])
            conn.execute(f"INSERT INTO {meta_table} VALUES ('schema_version', ?)", [str(newest)])
        current = newest
    for version, statements in migrations:
        if version <= current:
            continue
        with transaction(conn):
            for sql in statements:
                conn.execute(sql)
            conn.execute(f"UPDATE {meta_table} SET value = ? WHERE key = 'schema_version'", [str(version)])
        current = version
    if checkpoint and current != start:
        conn.execute("CHECKPOINT")
    return current


EXPERIENCE_FILE = "experience.duckdb"

def open_experience(path: Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if new) and migrate `experience.duckdb`; read-only opens only check it."""
    conn = connect_checked(path, read_only=read_only)
    try:
        if read_only:
            version = stored_version(conn, path, "xdb_meta", APP)
            if version != SCHEMA_VERSION:
                raise ValueError(f"{path} has schema version {version}, this AHC reads {SCHEMA_VERSION}; "
                                 "open it once read-write (ahc serve) to migrate it")
        else:
            # Checkpointed at once: DuckDB 1.5.5 cannot replay a WAL that adds a column to a table whose key
            # defaults to a sequence's nextval (compressed_records' trigger: "Calling DatabaseManager::
            # GetDefaultDatabase with no default database set"), so a server killed before its first
            # checkpoint would leave a file that never opens again.
            migrate(conn, path, MIGRATIONS, "xdb_meta", APP, checkpoint=True)
    except BaseException:
        conn.close()
        raise
    return conn
