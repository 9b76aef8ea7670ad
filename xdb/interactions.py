"""The discovery agent's tables: `interaction_log` (every turn) and `meta_knowledge` (the
synthesised theory at each compaction), keyed by a run id so runs can share one store."""

from __future__ import annotations

from typing import Any

import duckdb

from xdb.audit import AuditEvent
from xdb.sql import Row, one_int, transaction

TURN_COLUMNS = ("turn_id", "run_id", "timestamp", "journal_entry", "tool_call_json", "tool_result_json",
                "token_count")
KNOWLEDGE_COLUMNS = ("version_id", "run_id", "theorems_json", "negative_knowledge", "last_compacted_turn",
                     "created_at")
RUN_TABLES = ("interaction_log", "meta_knowledge")
KEYS = {"interaction_log": "turn_id", "meta_knowledge": "version_id"}


def _rows(rows: list[Row], cols: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        rec = dict(zip(cols, r))
        for key in ("timestamp", "created_at"):
            if key in rec:
                rec[key] = rec[key].isoformat() + "Z"
        out.append(rec)
    return out


def log_interaction(cur: duckdb.DuckDBPyConnection, run_id: str, *, journal_entry: str | None = None,
                    tool_call_json: str | None = None, tool_result_json: str | None = None,
                    token_count: int | None = None) -> int:
    return one_int(cur.execute(
        "INSERT INTO interaction_log (run_id, timestamp, journal_entry, tool_call_json, tool_result_json, token_count) "
        "VALUES (?, now(), ?, ?, ?, ?) RETURNING turn_id",
        [run_id, journal_entry, tool_call_json, tool_result_json, token_count]))


def interactions(cur: duckdb.DuckDBPyConnection, run_id: str | None = None, *, pattern: str | None = None,
                 after_turn: int | None = None, last: int | None = None) -> list[dict[str, Any]]:
    """Turns in order; `pattern` finds turns mentioning it (the agent's query_log), `last` tails."""
    sql = (f"SELECT {', '.join(TURN_COLUMNS)} FROM interaction_log WHERE (? IS NULL OR run_id = ?) "
           "AND (? IS NULL OR turn_id > ?) AND (? IS NULL OR contains(journal_entry, ?) OR contains(tool_call_json, ?) "
           "OR contains(tool_result_json, ?))")
    args = [run_id, run_id, after_turn, after_turn, pattern, pattern, pattern, pattern]
    if last is not None:
        rows = cur.execute(sql + " ORDER BY turn_id DESC LIMIT ?", args + [last]).fetchall()[::-1]
    else:
        rows = cur.execute(sql + " ORDER BY turn_id", args).fetchall()
    return _rows(rows, TURN_COLUMNS)


def save_meta_knowledge(cur: duckdb.DuckDBPyConnection, run_id: str, *, theorems_json: str | None = None,
                        negative_knowledge: str | None = None, last_compacted_turn: int | None = None) -> int:
    return one_int(cur.execute(
        "INSERT INTO meta_knowledge (run_id, theorems_json, negative_knowledge, last_compacted_turn, created_at) "
        "VALUES (?, ?, ?, ?, now()) RETURNING version_id",
        [run_id, theorems_json, negative_knowledge, last_compacted_turn]))


def meta_knowledge(cur: duckdb.DuckDBPyConnection, run_id: str | None = None, *,
                   latest: bool = True) -> list[dict[str, Any]]:
    sql = (f"SELECT {', '.join(KNOWLEDGE_COLUMNS)} FROM meta_knowledge "
           "WHERE (? IS NULL OR run_id = ?) ORDER BY version_id")
    rows = cur.execute(sql + (" DESC LIMIT 1" if latest else ""), [run_id, run_id]).fetchall()
    return _rows(rows, KNOWLEDGE_COLUMNS)


def purge_run(cur: duckdb.DuckDBPyConnection, run_id: str, audit: AuditEvent | None = None) -> dict[str, int]:
    """Delete a run's rows from both tables, so a fresh run under the same id starts from an empty
    history; returns the rows deleted per table. A purge is chained in the audit log even when it
    finds nothing: it is a deliberate act, and rare."""
    deleted: dict[str, int] = {}
    spans: dict[str, list[int] | None] = {}
    with transaction(cur):
        for table in RUN_TABLES:
            span = cur.execute(f"SELECT min({KEYS[table]}), max({KEYS[table]}) FROM {table} WHERE run_id = ?",
                               [run_id]).fetchone()
            # DuckDB answers a DELETE with the number of rows it removed.
            deleted[table] = one_int(cur.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id]))
            spans[table] = None if span is None or span[0] is None else [span[0], span[1]]
        if audit is not None:
            audit("purge_run", {"run_id": run_id, "deleted": deleted,
                                "id_ranges": {f"{t}.{KEYS[t]}": spans[t] for t in RUN_TABLES}})
    return deleted
