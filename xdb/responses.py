"""Stored responses: what the Responses API keeps of a response made with `store` (its default), so a
client can read it back by id and continue it by `previous_response_id`, across a restart.

A stored response belongs to the session it was served in: it is deleted with that session (by request,
retention or another replica's tombstone) and read only by the tenant that owns the session. Each one
keeps the conversation it added (its request's input items as chat messages, without the
instructions, then its reply), so the whole conversation up to a response is its chain of
`previous_id`s walked back; each of its output items can be found by id (`item_reference`). `kept`
says whether the turn was served from the session's server-kept State (a continuation): only then does
the State hold the conversation up to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb

from xdb.audit import AuditEvent
from xdb.fidelity import hot_cutoff
from xdb.interface import reads, writes
from xdb.sql import one_int

# A conversation walked back further than this is cut at its oldest responses (a cycle cannot occur:
# a response names only an earlier one; this bounds a pathological chain).
MAX_CHAIN = 10_000


@dataclass(frozen=True)
class StoredResponse:
    id: str
    session_id: str
    previous_id: str | None
    kept: bool
    latest: bool                  # no later response is stored in its session
    response: dict[str, Any]      # the response object as it was served


@writes
def save_response(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, response_id: str, session_id: str,
                  previous_id: str | None, kept: bool, conversation: list[dict[str, Any]],
                  response: dict[str, Any]) -> None:
    created_at = hot_cutoff(0.0)
    cur.execute("INSERT INTO stored_responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                [response_id, session_id, previous_id, kept, json.dumps(conversation, ensure_ascii=False),
                 json.dumps(response, ensure_ascii=False), created_at])
    items = [item["id"] for item in response.get("output") or () if isinstance(item, dict) and item.get("id")]
    if items:
        cur.executemany("INSERT INTO response_items VALUES (?, ?, ?, ?)",
                        [[item, response_id, session_id, created_at] for item in items])


@reads
def stored_response(cur: duckdb.DuckDBPyConnection, response_id: str) -> StoredResponse | None:
    row = cur.execute(
        "SELECT r.id, r.session_id, r.previous_id, r.kept, NOT EXISTS (SELECT 1 FROM stored_responses l "
        "WHERE l.session_id = r.session_id AND l.created_at > r.created_at), r.response_json "
        "FROM stored_responses r WHERE r.id = ?", [response_id]).fetchone()
    if row is None:
        return None
    rid, session_id, previous_id, kept, latest, response = row
    return StoredResponse(rid, session_id, previous_id, bool(kept), bool(latest), json.loads(response))


@reads
def response_items(cur: duckdb.DuckDBPyConnection, item_ids: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The stored output items with these ids, newest first, each with its session: (session id, item)."""
    rows = cur.execute(
        "SELECT i.item_id, i.session_id, r.response_json FROM response_items i "
        "JOIN stored_responses r ON r.id = i.response_id WHERE i.item_id IN (SELECT unnest(?)) "
        "ORDER BY i.created_at DESC", [item_ids]).fetchall()
    return [(session_id, item) for item_id, session_id, response in rows
            for item in json.loads(response).get("output") or () if item.get("id") == item_id]


@reads
def response_conversation(cur: duckdb.DuckDBPyConnection, response_id: str) -> list[dict[str, Any]]:
    """The chat messages of the conversation up to and including the response, oldest first (the
    responses of its chain that were deleted with their sessions left out)."""
    rows = cur.execute(f"""
        WITH RECURSIVE chain(id, previous_id, conversation, depth) AS (
            SELECT id, previous_id, conversation_json, 0 FROM stored_responses WHERE id = ?
            UNION ALL
            SELECT r.id, r.previous_id, r.conversation_json, c.depth + 1
            FROM stored_responses r JOIN chain c ON r.id = c.previous_id WHERE c.depth < {MAX_CHAIN})
        SELECT conversation FROM chain ORDER BY depth DESC""", [response_id]).fetchall()
    return [message for (conversation,) in rows for message in json.loads(conversation)]


@writes
def delete_response(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, response_id: str) -> bool:
    deleted = one_int(cur.execute("DELETE FROM stored_responses WHERE id = ?", [response_id])) > 0
    cur.execute("DELETE FROM response_items WHERE response_id = ?", [response_id])
    if deleted and audit is not None:
        audit("delete_response", {"response_id": response_id})
    return deleted
