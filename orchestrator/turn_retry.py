"""A retried turn joins the State once; only a turn whose reply never reached its client is replaced.

A client that lost a reply (a timeout, a dropped connection, a 503 after the turn was saved) sends the
same turn again; appended again, the State would hold it twice. Each committed turn leaves a mark on its
session: what the turn brought, the client's `Idempotency-Key` if it sent one, what the commit changed,
and whether its reply was delivered (the whole JSON body handed to the server for sending, or a stream's
last event sent). A request that is a retry of the session's last turn undoes that turn first and takes
its place, and only while that turn's reply is undelivered: a client that got the reply whole has no
reason to send its turn again, so an SDK retry repeating its words is a turn of its own (and its key sent
again is refused, below).

A request is a retry of the last turn when it carries the same `Idempotency-Key` (the HTTP convention for
a request sent again), or, without one, when it is an automatic retry of the official SDKs
(`X-Stainless-Retry-Count` above 0, which they send on every attempt after the first) and brings the same
turns and query. An SDK retries a request whose first attempt never got in (AHC's own 429, a 503, a
reset) too, and agents often send the same words twice ("continue", an identical tool result): that
retry's words repeat an answered turn, which stays. A user who sends the same words twice on purpose
sends a first attempt each time: both join the State.

The same `Idempotency-Key` is the same request: with other words it is refused (422, `KeyReused`), and
once its reply was delivered it is not run again (409, `Answered`: the reply is the session's last turn,
`GET /v1/context/sessions/{id}`); neither changes what is stored.

The mark is saved with the State, its delivery is not: the State is saved once per turn, before its
reply goes out, so only the mark in memory learns that the reply was delivered. A mark read back from
the store counts as delivered (a restart, another replica, a session back in memory: a turn is kept
rather than risk dropping one the client saw), except the turn whose save this server saw fail or go
unanswered (`SessionStore.reload`): that turn's client got an error, so its retry takes its place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.errors import Conflict, InvalidRequest
from orchestrator.context_spec import KarmaEntry
from orchestrator.message import Message

IDEMPOTENCY_KEY = "Idempotency-Key"  # the header the errors below name


class KeyReused(InvalidRequest):
    """The last turn's `Idempotency-Key` on a request that brings other words: 422."""

    status = 422

    def __init__(self) -> None:
        super().__init__(f"{IDEMPOTENCY_KEY}: the session's last turn was sent with this key and other messages; "
                         "a new request needs a new key", param=IDEMPOTENCY_KEY, code="idempotency_key_reused")


class Answered(Conflict):
    """The last turn's `Idempotency-Key` again, once that turn's reply was delivered: 409."""

    def __init__(self) -> None:
        super().__init__(f"{IDEMPOTENCY_KEY}: the request with this key was answered already; its reply is the "
                         "session's last turn (GET /v1/context/sessions/{session_id}), and a new request needs "
                         "a new key", param=IDEMPOTENCY_KEY, code="idempotency_key_answered")


@dataclass(frozen=True)
class Retry:
    """How a request marks itself as sent again: its `Idempotency-Key` (None: none sent), and whether it
    is an SDK's automatic retry."""

    key: str | None = None
    automatic: bool = False

    @classmethod
    def of(cls, idempotency_key: str | None, retry_count: str | None) -> Retry:
        """From the request's `Idempotency-Key` and `X-Stainless-Retry-Count` headers."""
        key = idempotency_key.strip() if idempotency_key else None
        automatic = retry_count is not None and retry_count.strip().isdigit() and int(retry_count) > 0
        return cls(digest(key) if key else None, automatic)


@dataclass
class TurnMark:
    """The session's last committed turn: what it brought (`brought`, a digest of its messages and query),
    the digest of the client's key, the State's fields as they were before it (messages: how many), and
    whether its reply was delivered (not saved: a mark read back from the store counts as delivered)."""

    brought: str
    key: str | None
    messages_before: int
    karma_before: list[KarmaEntry] = field(default_factory=list)
    staged_karma_before: list[KarmaEntry] = field(default_factory=list)
    delivered: bool = field(default=True, compare=False)

    def retried_by(self, brought: str, retry: Retry) -> bool:
        """Whether the request takes this turn's place; raises when it repeats this turn's key but is
        not its retry (`KeyReused`, `Answered`)."""
        if retry.key is not None:
            if retry.key != self.key:
                return False
            if brought != self.brought:
                raise KeyReused()
            if self.delivered:
                raise Answered()
            return True
        return retry.automatic and self.key is None and brought == self.brought and not self.delivered

    def to_dict(self) -> dict[str, Any]:
        return {"brought": self.brought, "key": self.key, "messages_before": self.messages_before,
                "karma_before": [k.model_dump() for k in self.karma_before],
                "staged_karma_before": [k.model_dump() for k in self.staged_karma_before]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnMark:
        # "turns_before": the mark of a State saved while its messages were called turns.
        before = data["messages_before"] if "messages_before" in data else data["turns_before"]
        return cls(data["brought"], data.get("key"), int(before),
                   [KarmaEntry.model_validate(k) for k in data.get("karma_before", [])],
                   [KarmaEntry.model_validate(k) for k in data.get("staged_karma_before", [])])


def brought(new_messages: Sequence[Message], query: str | None) -> str:
    """A digest of what a turn brings to the State: its new messages and its query."""
    return digest(json.dumps([[m.to_message() for m in new_messages], query], sort_keys=True, default=str))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
