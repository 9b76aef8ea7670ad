"""Stored responses: what the Responses API keeps of a response made with `store` (its default), so a
client can read it back by id and continue it by `previous_response_id`, across a restart.

A stored response belongs to the session it was served in: it is deleted with that session (by request,
retention or another replica's tombstone) and read only by the tenant that owns the session. Each one
keeps only what it added to its conversation, as chat messages (without the instructions), its reply
last:

- a continuation (`previous_id`): its request's input, then its reply; the conversation up to it is its
  chain of `previous_id`s walked back;
- any other response: a request that sends its conversation again (Codex CLI, the Vercel AI SDK: each
  request resends the history) begins with the conversation up to an earlier stored response of its
  session, which it references (`base_id`, and `base_messages`: how many of that conversation's messages
  its input begins with; the earlier reply as the client sent it back may differ from the stored one)
  and keeps only the rest. A history resent over N turns is stored once, not N times.

By reference means by content: each such row keeps the digest of its input and of its whole conversation
(`input_sha`, `conversation_sha`: chained message by message, so one pass digests every prefix of a
request's input), which is how a later request finds the longest stored conversation it begins with.
Deleting a response that others reference moves the messages they read through it into them first, so
what each of them was sent stays whole. Rows stored before the references have none of these columns:
they read as before and are never referenced.

Each of a stored response's output items can be found by id (`item_reference`). `kept` says whether
the turn was served from the session's server-kept State (a continuation); `state_sha` is the digest of
that State once the turn was committed (`state_digest`): a later continuation joins the State only
while it still holds exactly the conversation up to the response it continues.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from xdb.audit.log import AuditEvent
from xdb.interface import reads, writes
from xdb.sql import one_int
from xdb.storage.fidelity import hot_cutoff

# A conversation walked back further than this is cut at its oldest responses (a cycle cannot occur:
# a response names only an earlier one; this bounds a pathological chain).
MAX_CHAIN = 10_000


@dataclass(frozen=True)
class StoredResponse:
    id: str
    session_id: str
    previous_id: str | None
    kept: bool
    state_sha: str | None         # the session's State once its turn committed (a kept turn's)
    response: dict[str, Any]      # the response object as it was served


@dataclass(frozen=True)
class _Reference:
    """What a new row keeps: the earlier response whose conversation its input begins with (and how many
    of its messages), the messages after those, and the digests it is found by in turn."""

    base_id: str | None
    base_messages: int | None
    rest: list[dict[str, Any]]
    input_sha: str | None
    conversation_sha: str | None


@dataclass(frozen=True)
class _ChainRow:
    link: str | None              # previous_id or base_id
    base_messages: int | None     # set when the link is a base_id
    conversation: list[dict[str, Any]]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def chained(messages: Sequence[dict[str, Any]], head: str = "") -> list[str]:
    """The digest of each prefix of `messages` (the first message's, the first two's, ...), each the
    digest of the one before and the message."""
    digests = []
    for message in messages:
        head = digest(head + digest(json.dumps(message, sort_keys=True, default=str)))
        digests.append(head)
    return digests


def state_digest(summary: str | None, messages: Sequence[dict[str, Any]]) -> str:
    """The conversation a session's State holds (its summary, its messages)."""
    return digest(json.dumps([summary, list(messages)], sort_keys=True, default=str))


def _reference(cur: duckdb.DuckDBPyConnection, session_id: str, previous_id: str | None,
               conversation: list[dict[str, Any]]) -> _Reference:
    if previous_id is not None:  # a continuation adds only its input; found by no later request
        return _Reference(None, None, conversation, None, None)
    digests = chained(conversation)
    sent = digests[:-1]  # the prefixes of its input (the reply, last, is not)
    input_sha = sent[-1] if sent else None
    rows = cur.execute(
        "SELECT id, conversation_sha, input_sha FROM stored_responses WHERE session_id = ? AND "
        "(conversation_sha IN (SELECT unnest(?)) OR input_sha IN (SELECT unnest(?)))",
        [session_id, sent, sent]).fetchall() if sent else []
    where = {sha: index + 1 for index, sha in enumerate(sent)}
    matches = [(max(where.get(full, 0), where.get(own, 0)), rid) for rid, full, own in rows]
    count, base_id = max(matches, default=(0, None))
    if base_id is None:
        return _Reference(None, None, conversation, input_sha, digests[-1])
    return _Reference(base_id, count, conversation[count:], input_sha, digests[-1])


@writes
def save_response(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, response_id: str, session_id: str,
                  previous_id: str | None, kept: bool, conversation: list[dict[str, Any]],
                  response: dict[str, Any], state_sha: str | None = None) -> None:
    """`conversation`: the request's input as chat messages, then the reply."""
    created_at = hot_cutoff(0.0)
    ref = _reference(cur, session_id, previous_id, conversation)
    cur.execute("INSERT INTO stored_responses (id, session_id, previous_id, kept, conversation_json, response_json, "
                "created_at, base_id, base_messages, input_sha, conversation_sha, state_sha) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [response_id, session_id, previous_id, kept, json.dumps(ref.rest, ensure_ascii=False),
                 json.dumps(response, ensure_ascii=False), created_at, ref.base_id, ref.base_messages,
                 ref.input_sha, ref.conversation_sha, state_sha])
    items = [item["id"] for item in response.get("output") or () if isinstance(item, dict) and item.get("id")]
    if items:
        cur.executemany("INSERT INTO response_items VALUES (?, ?, ?, ?)",
                        [[item, response_id, session_id, created_at] for item in items])


@reads
def stored_response(cur: duckdb.DuckDBPyConnection, response_id: str) -> StoredResponse | None:
    row = cur.execute("SELECT id, session_id, previous_id, kept, state_sha, response_json FROM stored_responses "
                      "WHERE id = ?", [response_id]).fetchone()
    if row is None:
        return None
    rid, session_id, previous_id, kept, state_sha, response = row
    return StoredResponse(rid, session_id, previous_id, bool(kept), state_sha, json.loads(response))


@reads
def response_items(cur: duckdb.DuckDBPyConnection, item_ids: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The stored output items with these ids, newest first, each with its session: (session id, item)."""
    rows = cur.execute(
        "SELECT i.item_id, i.session_id, r.response_json FROM response_items i "
        "JOIN stored_responses r ON r.id = i.response_id WHERE i.item_id IN (SELECT unnest(?)) "
        "ORDER BY i.created_at DESC", [item_ids]).fetchall()
    return [(session_id, item) for item_id, session_id, response in rows
            for item in json.loads(response).get("output") or () if item.get("id") == item_id]


def _chain(cur: duckdb.DuckDBPyConnection, response_id: str) -> list[_ChainRow]:
    """The rows the conversation up to a response is made of, oldest first."""
    rows = cur.execute(f"""
        WITH RECURSIVE chain(id, link, base_messages, conversation, depth) AS (
            SELECT id, coalesce(previous_id, base_id), base_messages, conversation_json, 0
            FROM stored_responses WHERE id = ?
            UNION ALL
            SELECT r.id, coalesce(r.previous_id, r.base_id), r.base_messages, r.conversation_json, c.depth + 1
            FROM stored_responses r JOIN chain c ON r.id = c.link WHERE c.depth < {MAX_CHAIN})
        SELECT link, base_messages, conversation FROM chain ORDER BY depth DESC""", [response_id]).fetchall()
    return [_ChainRow(link, base_messages, json.loads(conversation)) for link, base_messages, conversation in rows]


def _joined(rows: list[_ChainRow]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for row in rows:
        if row.base_messages is not None:  # the messages of its base its input began with
            messages = messages[:row.base_messages]
        messages += row.conversation
    return messages


@reads
def response_conversation(cur: duckdb.DuckDBPyConnection, response_id: str) -> list[dict[str, Any]]:
    """The chat messages of the conversation up to and including the response, oldest first (the
    responses of its chain of continuations that were deleted, or deleted with their sessions, left out)."""
    return _joined(_chain(cur, response_id))


@reads
def response_input(cur: duckdb.DuckDBPyConnection, response_id: str) -> list[dict[str, Any]]:
    """The chat messages the response's request brought, as it sent them (a continuation: only its own)."""
    rows = _chain(cur, response_id)
    if not rows:
        return []
    own = rows[-1]
    if own.base_messages is None:
        return own.conversation[:-1]
    return _joined(rows)[:-1]


@writes
def delete_response(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, response_id: str) -> bool:
    """The response, its items and its messages, but those a later response's input began with: moved
    into that response (its request sent them too)."""
    row = cur.execute("SELECT session_id, base_id, base_messages, conversation_json FROM stored_responses "
                      "WHERE id = ?", [response_id]).fetchone()
    if row is not None:
        _hand_down(cur, response_id, *row)
    deleted = one_int(cur.execute("DELETE FROM stored_responses WHERE id = ?", [response_id])) > 0
    cur.execute("DELETE FROM response_items WHERE response_id = ?", [response_id])
    if deleted and audit is not None:
        audit("delete_response", {"response_id": response_id})
    return deleted


def _hand_down(cur: duckdb.DuckDBPyConnection, response_id: str, session_id: str, base_id: str | None,
               base_messages: int | None, conversation_json: str) -> None:
    """Each response that references this one references its base instead, this one's messages it read
    now its own."""
    own = json.loads(conversation_json)
    before = base_messages or 0  # of this one's conversation, those read from its own base
    dependents = cur.execute("SELECT id, base_messages, conversation_json FROM stored_responses "
                             "WHERE session_id = ? AND base_id = ?", [session_id, response_id]).fetchall()
    for dependent, count, rest in dependents:
        merged = own[:count - before] + json.loads(rest)
        cur.execute("UPDATE stored_responses SET base_id = ?, base_messages = ?, conversation_json = ? WHERE id = ?",
                    [base_id, base_messages, json.dumps(merged, ensure_ascii=False), dependent])
