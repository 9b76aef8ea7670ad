"""A retried turn joins the State once.

A client that lost a reply (a timeout, a dropped connection, a 503 after the turn was saved) sends the
same turn again; appended again, the State would hold it twice. Each committed turn leaves a mark on its
session: what the turn brought, the client's `Idempotency-Key` if it sent one, and what the commit
changed. A request that is a retry of the session's last turn undoes that turn first and takes its place.

A request is a retry of the last turn when it carries the same `Idempotency-Key` (the HTTP convention for
a request sent again), or, without one, when it is an automatic retry of the official SDKs
(`X-Stainless-Retry-Count` above 0, which they send on every attempt after the first) and brings the same
turns and query. A user who sends the same words twice on purpose sends a first attempt each time: both
join the State.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.context_spec import KarmaEntry
from orchestrator.turn import Turn


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
    """The session's last committed turn: what it brought (`brought`, a digest of its turns and query),
    the digest of the client's key, and the State's fields as they were before it (turns: how many)."""

    brought: str
    key: str | None
    turns_before: int
    karma_before: list[KarmaEntry] = field(default_factory=list)
    staged_karma_before: list[KarmaEntry] = field(default_factory=list)

    def retried_by(self, brought: str, retry: Retry) -> bool:
        if retry.key is not None:
            return retry.key == self.key
        return retry.automatic and self.key is None and brought == self.brought

    def to_dict(self) -> dict[str, Any]:
        return {"brought": self.brought, "key": self.key, "turns_before": self.turns_before,
                "karma_before": [k.model_dump() for k in self.karma_before],
                "staged_karma_before": [k.model_dump() for k in self.staged_karma_before]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnMark:
        return cls(data["brought"], data.get("key"), int(data["turns_before"]),
                   [KarmaEntry.model_validate(k) for k in data.get("karma_before", [])],
                   [KarmaEntry.model_validate(k) for k in data.get("staged_karma_before", [])])


def brought(new_turns: Sequence[Turn], query: str | None) -> str:
    """A digest of what a turn brings to the State: its new turns and its query."""
    return digest(json.dumps([[t.to_message() for t in new_turns], query], sort_keys=True, default=str))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
