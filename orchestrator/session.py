"""Sessions: the State the server keeps for a `session_id`, append-only between compactions.

Persisted through a pair of callables (XDB in the server) so a restart resumes the session. One lock
per session keeps its turns in request order when a client sends concurrently.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.context_spec import KarmaEntry
from orchestrator.turn import Turn


@dataclass
class Session:
    session_id: str
    turns: list[Turn] = field(default_factory=list)
    summary: str | None = None
    last_hashes: dict[str, str] | None = None
    compactions: int = 0
    compacted_turns: int = 0
    karma: list[KarmaEntry] = field(default_factory=list)         # in the Karma block
    staged_karma: list[KarmaEntry] = field(default_factory=list)  # in State turns (orchestrator/karma.py)

    def to_json(self) -> str:
        return json.dumps({
            "session_id": self.session_id, "turns": [t.to_message() for t in self.turns],
            "summary": self.summary, "last_hashes": self.last_hashes,
            "compactions": self.compactions, "compacted_turns": self.compacted_turns,
            "karma": [k.model_dump() for k in self.karma],
            "staged_karma": [k.model_dump() for k in self.staged_karma],
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Session:
        data = json.loads(text)
        return cls(session_id=data["session_id"], turns=[Turn.from_message(m) for m in data["turns"]],
                   summary=data.get("summary"), last_hashes=data.get("last_hashes"),
                   compactions=data.get("compactions", 0), compacted_turns=data.get("compacted_turns", 0),
                   karma=[KarmaEntry.model_validate(k) for k in data.get("karma", [])],
                   staged_karma=[KarmaEntry.model_validate(k) for k in data.get("staged_karma", [])])


class SessionStore:
    def __init__(self, load: Callable[[str], str | None] | None = None,
                 save: Callable[[str, str], None] | None = None) -> None:
        self._load, self._save = load, save
        self._sessions: dict[str, Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            stored = self._load(session_id) if self._load else None
            session = Session.from_json(stored) if stored else Session(session_id)
            self._sessions[session_id] = session
        return session

    def save(self, session: Session) -> Any:
        """Persist; returns what the save callable returns (the server's is a Future to await)."""
        return self._save(session.session_id, session.to_json()) if self._save else None
