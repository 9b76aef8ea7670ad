"""Sessions inferred from the messages themselves, for clients that name none (most agents resend their
whole history each turn and send no id): a request whose messages begin with a recent conversation's
latest messages (its last request's, then the reply) continues that conversation's session.

Each conversation is known by one hash, chained over its messages and seeded with the tenant's prefix,
so another tenant's conversation never matches; each tenant's are kept in a table of its own, so
another tenant's traffic never pushes them out either. Only a conversation's latest head continues it: a
request that edits an earlier message, or resends an earlier state, matches no head and starts a new
session, never rewriting the first one's history.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


def message_digest(message: dict[str, Any]) -> bytes:
    """What makes a message the same message when a client resends it: its role, its text (parts
    joined, none as empty), its tool calls' names and arguments (parsed, so spacing does not count)
    and the call a tool result answers. Ids a client may regenerate and reasoning are left out."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    calls = []
    for call in message.get("tool_calls") or ():
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        calls.append([function.get("name"), _arguments(function.get("arguments"))])
    # The text is hashed as it stands, not inside the JSON of the rest: a long history (an agent's system
    # prompt, pasted files) is hashed on every request, and JSON-escaping it cost most of that.
    rest = [message.get("role"), calls, message.get("tool_call_id")]
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True, ensure_ascii=False).encode() + b"\0")
    digest.update(str(content or "").encode("utf-8", "surrogatepass"))
    return digest.digest()


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def chain(tenant_prefix: str, messages: list[dict[str, Any]]) -> list[str]:
    """The head of every prefix of `messages` (the first message's, the first two's, ...)."""
    heads, head = [], hashlib.sha256(tenant_prefix.encode()).hexdigest()
    for message in messages:
        head = extend(head, message)
        heads.append(head)
    return heads


def extend(head: str, message: dict[str, Any]) -> str:
    """The head of a conversation whose head was `head`, one message on (a reply)."""
    return hashlib.sha256(bytes.fromhex(head) + message_digest(message)).hexdigest()


# Tenants whose conversations are kept; past this the tenant least recently heard from loses its table.
MAX_TENANTS = 64


class Conversations:
    """The latest head of each tenant's most recently continued conversations. Each tenant's table is its
    own, bounded at `capacity` (least recently used dropped), so one tenant's one-off requests never push
    another's conversations out; at most `max_tenants` tables are kept (the least recently used dropped).
    A request's chain is hashed once: `find` takes it, and `advance` the reply's extension of its last head.
    `tenant`: the tenant's prefix (the one its heads are seeded with)."""

    def __init__(self, capacity: int, max_tenants: int = MAX_TENANTS) -> None:
        self.capacity = max(capacity, 1)
        self.max_tenants = max(max_tenants, 1)
        self._tables: OrderedDict[str, _Table] = OrderedDict()

    def find(self, heads: list[str], tenant: str = "") -> tuple[str, int] | None:
        """The session whose latest head is the longest of a request's `heads` (`chain`), with how many of
        the request's messages that head covers (the messages its session has seen); None if none is."""
        table = self._tables.get(tenant)
        if table is None:
            return None
        self._tables.move_to_end(tenant)
        return table.find(heads)

    def seen(self, session_id: str, heads: list[str], tenant: str = "") -> int | None:
        """How many of a request's messages the session has seen: those its latest head covers, or else
        its last request's (a client that gives back another reply than the model's); None when the
        request continues neither, or the session is not known."""
        table = self._tables.get(tenant)
        return None if table is None else table.seen(session_id, heads)

    def advance(self, session_id: str, head: str, asked: str | None = None, tenant: str = "") -> None:
        """`head` (a request's last, `asked`, extended by its reply) is now the session's latest."""
        table = self._tables.pop(tenant, None) or _Table()
        self._tables[tenant] = table
        while len(self._tables) > self.max_tenants:
            self._tables.popitem(last=False)
        table.advance(session_id, head, asked, self.capacity)


@dataclass
class _Table:
    """One tenant's conversations."""

    sessions: OrderedDict[str, str] = field(default_factory=OrderedDict)  # head -> session id
    heads: dict[str, str] = field(default_factory=dict)  # session id -> its latest head
    asked: dict[str, str] = field(default_factory=dict)  # session id -> its last request's head (before the reply)

    def find(self, heads: list[str]) -> tuple[str, int] | None:
        for index in range(len(heads) - 1, -1, -1):
            session_id = self.sessions.get(heads[index])
            if session_id is not None:
                self.sessions.move_to_end(heads[index])
                return session_id, index + 1
        return None

    def seen(self, session_id: str, heads: list[str]) -> int | None:
        for head in (self.heads.get(session_id), self.asked.get(session_id)):
            if head is not None:
                for index in range(len(heads) - 1, -1, -1):
                    if heads[index] == head:
                        return index + 1
        return None

    def advance(self, session_id: str, head: str, asked: str | None, capacity: int) -> None:
        if asked is not None:
            self.asked[session_id] = asked
        previous = self.heads.pop(session_id, None)
        if previous is not None:
            self.sessions.pop(previous, None)
        stale = self.sessions.pop(head, None)  # another session that ended on the same messages
        if stale is not None:
            self.heads.pop(stale, None)
        self.sessions[head] = session_id
        self.heads[session_id] = head
        while len(self.sessions) > capacity:
            _, dropped = self.sessions.popitem(last=False)
            self.heads.pop(dropped, None)
            self.asked.pop(dropped, None)
