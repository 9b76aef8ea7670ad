"""Agent runs: `interaction_log` (every turn of a run) and `meta_knowledge` (the synthesised theory at
each compaction), keyed by a run id so runs can share one store; the runs listed from them; and each
run's end-of-run report PNG, kept as a document.

The discovery agent writes them, through the server's /v1/agent routes or its own local XDB. They are
tables of the experience database, not of the agent: a run lives in the same file, audit chain,
tenancy, exports and browser as the experience it produced, and both the server and the agent (which
may not import each other) read and write them through `xdb.read` / `xdb.write`."""

from __future__ import annotations

import base64
import json
from typing import Any

import duckdb

from core.errors import InvalidRequest
from xdb import documents
from xdb.audit.log import AuditEvent
from xdb.interface import reads, writes
from xdb.owner import owned
from xdb.rows import encoded
from xdb.sql import Row, digest, one_int, transaction
from xdb.tables import RUN, TABLES

TURN_COLUMNS = ("turn_id", "run_id", "timestamp", "journal_entry", "tool_call_json", "tool_result_json",
                "token_count")
KNOWLEDGE_COLUMNS = ("version_id", "run_id", "theorems_json", "negative_knowledge", "last_compacted_turn",
                     "created_at")
# The run's tables, each with the id its rows are numbered by.
KEYS = {t.name: t.sequence_column for t in TABLES if t.session_column == RUN and t.sequence_column is not None}
RUN_TABLES = tuple(KEYS)


def _rows(rows: list[Row], cols: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        rec = dict(zip(cols, r))
        for key in ("timestamp", "created_at"):
            if key in rec:
                rec[key] = rec[key].isoformat() + "Z"
        out.append(rec)
    return out


@writes
def log_interaction(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, run_id: str, *,
                    journal_entry: str | None = None, tool_call_json: str | None = None,
                    tool_result_json: str | None = None, token_count: int | None = None) -> int:
    for text, field in ((run_id, "run_id"), (journal_entry, "journal_entry"), (tool_call_json, "tool_call_json"),
                        (tool_result_json, "tool_result_json")):
        encoded(text, field)
    with transaction(cur):
        turn_id = one_int(cur.execute(
            "INSERT INTO interaction_log (run_id, timestamp, journal_entry, tool_call_json, tool_result_json, "
            "token_count) VALUES (?, now(), ?, ?, ?, ?) RETURNING turn_id",
            [run_id, journal_entry, tool_call_json, tool_result_json, token_count]))
        if audit is not None:  # what was logged, by hash: the log's text stays in the experience file
            audit("agent_interaction", {"run_id": run_id, "turn_id": turn_id,
                                        "sha256": digest(journal_entry, tool_call_json, tool_result_json)})
    return turn_id


@reads
def list_interactions(cur: duckdb.DuckDBPyConnection, run_id: str | None = None, *, pattern: str | None = None,
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


@writes
def save_meta_knowledge(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, run_id: str, *,
                        theorems_json: str | None = None, negative_knowledge: str | None = None,
                        last_compacted_turn: int | None = None) -> int:
    with transaction(cur):
        version_id = one_int(cur.execute(
            "INSERT INTO meta_knowledge (run_id, theorems_json, negative_knowledge, last_compacted_turn, created_at) "
            "VALUES (?, ?, ?, ?, now()) RETURNING version_id",
            [run_id, theorems_json, negative_knowledge, last_compacted_turn]))
        if audit is not None:
            audit("agent_knowledge", {"run_id": run_id, "version_id": version_id,
                                      "sha256": digest(theorems_json, negative_knowledge)})
    return version_id


@reads
def meta_knowledge(cur: duckdb.DuckDBPyConnection, run_id: str | None = None, *,
                   latest: bool = True) -> list[dict[str, Any]]:
    sql = (f"SELECT {', '.join(KNOWLEDGE_COLUMNS)} FROM meta_knowledge "
           "WHERE (? IS NULL OR run_id = ?) ORDER BY version_id")
    rows = cur.execute(sql + (" DESC LIMIT 1" if latest else ""), [run_id, run_id]).fetchall()
    return _rows(rows, KNOWLEDGE_COLUMNS)


@writes
def purge_run(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, run_id: str) -> dict[str, int]:
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


@reads
def list_runs(cur: duckdb.DuckDBPyConnection, owner: str, limit: int = 100) -> list[dict[str, Any]]:
    """The runs of one tenant (`owner`, xdb/owner.py), most recently active first: turns and
    knowledge versions counted, first and last activity, the latest snapshot's theorem count, and
    whether a report is stored (`report_name`, one of the tenant's documents)."""
    condition, params = owned("run_id", owner)
    rows = cur.execute(
        "WITH events AS ("
        f" SELECT run_id, timestamp AS t, 1 AS turn, 0 AS version FROM interaction_log WHERE {condition}"
        " UNION ALL"
        f" SELECT run_id, created_at, 0, 1 FROM meta_knowledge WHERE {condition}) "
        "SELECT run_id, sum(turn), sum(version), min(t), max(t) FROM events GROUP BY run_id "
        "ORDER BY max(t) DESC, run_id LIMIT ?", [*params, *params, limit]).fetchall()
    ids = [r[0] for r in rows]
    theorems = _theorem_counts(cur, ids)
    reported = _reported(cur, ids, owner)
    return [{"run_id": run_id, "turns": int(turns), "first_at": first.isoformat() + "Z",
             "last_at": last.isoformat() + "Z", "knowledge_versions": int(versions),
             "theorems": theorems.get(run_id, 0), "has_report": run_id in reported}
            for run_id, turns, versions, first, last in rows]


def _theorem_counts(cur: duckdb.DuckDBPyConnection, run_ids: list[str]) -> dict[str, int]:
    # Counted here rather than in SQL: a snapshot is the agent's JSON, and one that is not a list
    # (or not JSON) counts as none instead of failing the whole listing.
    latest = cur.execute(
        "SELECT run_id, theorems_json FROM meta_knowledge WHERE list_contains(?::VARCHAR[], run_id) "
        "QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY version_id DESC) = 1", [run_ids]).fetchall()
    return {run_id: _count_list(text) for run_id, text in latest}


def _count_list(text: str | None) -> int:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return 0
    return len(value) if isinstance(value, list) else 0


def _reported(cur: duckdb.DuckDBPyConnection, run_ids: list[str], owner: str) -> set[str]:
    names = {report_name(run_id): run_id for run_id in run_ids}
    condition, params = owned("id", owner)
    found = cur.execute(f"SELECT DISTINCT name FROM documents WHERE {condition} "
                        "AND list_contains(?::VARCHAR[], name) AND list_contains(tags, ?)",
                        [*params, list(names), REPORT_TAG]).fetchall()
    return {names[name] for (name,) in found}


# -- the end-of-run report: a PNG kept as a document (base64 text), a new version per upload --------
REPORT_MAX_BYTES = 8 << 20  # the PNG itself, before base64
REPORT_TAG = "run-report"  # tells a run's report from a document the tenant named the same way
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def report_name(run_id: str) -> str:
    return f"runs/{run_id}/report.png"


def check_png(png: bytes) -> None:
    """InvalidRequest (naming `png_base64`, the HTTP body's field) unless `png` is a PNG within the cap."""
    if len(png) > REPORT_MAX_BYTES:
        raise InvalidRequest(f"png_base64: the PNG is {len(png)} bytes, over the {REPORT_MAX_BYTES}-byte limit",
                             param="png_base64")
    if not png.startswith(PNG_SIGNATURE):
        raise InvalidRequest("png_base64: the data is not a PNG (it does not start with the PNG signature)",
                             param="png_base64")


def _report_id(cur: duckdb.DuckDBPyConnection, run_id: str, owner: str) -> str | None:
    condition, params = owned("id", owner)
    row = cur.execute(f"SELECT id FROM documents WHERE {condition} AND name = ? AND list_contains(tags, ?) "
                      "ORDER BY updated_at DESC LIMIT 1", [*params, report_name(run_id), REPORT_TAG]).fetchone()
    return None if row is None else str(row[0])


def save_report(cur: duckdb.DuckDBPyConnection, run_id: str, png: bytes, owner: str) -> dict[str, Any]:
    """Store `png` as the run's report: a new document, or a new version of the run's one. The
    caller serialises calls (a new version reads the last one)."""
    check_png(png)
    content = base64.b64encode(png).decode("ascii")
    # Sized by the report's own cap, not xdb.max_document_bytes: that one is for text documents.
    max_bytes = len(content)
    doc_id = _report_id(cur, run_id, owner)
    if doc_id is None:
        return documents.add_document(cur, report_name(run_id), content, tags=[REPORT_TAG], source="agent",
                                      summary=f"end-of-run report of {run_id}", max_bytes=max_bytes,
                                      owner=owner)
    return documents.update_document(cur, doc_id, content, max_bytes=max_bytes)


@reads
def run_report(cur: duckdb.DuckDBPyConnection, run_id: str, owner: str) -> bytes | None:
    """The run's latest report PNG, None if none was stored (the caller names the run in its 404)."""
    doc_id = _report_id(cur, run_id, owner)
    if doc_id is None:
        return None
    return base64.b64decode(documents.get_document(cur, doc_id)["content"])
