"""Sessions inferred from the messages themselves, for clients that name none (most agents resend their
whole history each turn and send no id): a request whose messages begin with a recent conversation's
latest messages (its last request's, then the reply) continues that conversation's session.

Each conversation is known by one hash, chained over its messages and seeded with the tenant's prefix,
so another tenant's conversation never matches. Only a conversation's latest head continues it: a
request that edits an earlier message, or resends an earlier state, matches no head and starts a new
session, never rewriting the first one's history.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
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


class Conversations:
    """The latest head of the most recently continued conversations (least recently used dropped). A
    request's chain is hashed once: `find` takes it, and `advance` the reply's extension of its last head."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._sessions: OrderedDict[str, str] = OrderedDict()  # head -> session id
        self._heads: dict[str, str] = {}  # session id -> its latest head
        self._asked: dict[str, str] = {}  # session id -> its last request's head (before the reply)

    def find(self, heads: list[str]) -> tuple[str, int] | None:
        """The session whose latest head is the longest of a request's `heads` (`chain`), with how many of
        the request's messages that head covers (the messages its session has seen); None if none is."""
        for index in range(len(heads) - 1, -1, -1):
            session_id = self._sessions.get(heads[index])
            if session_id is not None:
                self._sessions.move_to_end(heads[index])
                return session_id, index + 1
        return None

    def seen(self, session_id: str, heads: list[str]) -> int | None:
        """How many of a request's messages the session has seen: those its latest head covers, or else
        its last request's (a client that gives back another reply than the model's); None when the
        request continues neither, or the session is not known."""
        for head in (self._heads.get(session_id), self._asked.get(session_id)):
            if head is not None:
                for index in range(len(heads) - 1, -1, -1):
                    if heads[index] == head:
                        return index + 1
        return None

    def advance(self, session_id: str, head: str, asked: str | None = None) -> None:
        """`head` (a request's last, `asked`, extended by its reply) is now the session's latest."""
        if asked is not None:
            self._asked[session_id] = asked
        previous = self._heads.pop(session_id, None)
        if previous is not None:
            self._sessions.pop(previous, None)
        stale = self._sessions.pop(head, None)  # another session that ended on the same messages
        if stale is not None:
            self._heads.pop(stale, None)
        self._sessions[head] = session_id
        self._heads[session_id] = head
        while len(self._sessions) > self.capacity:
            _, dropped = self._sessions.popitem(last=False)
            self._heads.pop(dropped, None)
            self._asked.pop(dropped, None)
