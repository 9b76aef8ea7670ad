"""The cache report a response carries as `context`: the prompt's blocks, where the prefix cache broke,
and what the governors did to the request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.blocks import Block

PASSTHROUGH = "passthrough"  # a request without `context`: sent as the client wrote it
# `first_changed_block` of a session's first turn on a server other than the one that served it last
# (a failover, or a router that moved it): its prefix is cached over there, nothing is cached here.
REPLICA = "replica"
SIDE_CALL = "side"  # session_naming of a side call


@dataclass
class CacheReport:
    mode: str  # cag | rag | passthrough
    blocks: tuple[Block, ...]
    prefix_sha256: str
    first_changed_block: str | None  # the first block whose hash differs from the session's last request
    governor: list[str] = field(default_factory=list)  # actions, in the order they were taken
    codex: tuple[dict[str, Any], ...] = ()  # per Codex document: its source and the rendition used
    mode_switches: int = 0  # the session's changes of Codex placement so far, this request's included
    switched: tuple[str, str] | None = None  # this request's change of placement (from, to)
    # How the request's session was named: by the client (`explicit`), continued from the messages of a
    # recent request that named none (`inferred`), or started by this request (`new`); `side`: a side call
    # of a session the client named (orchestrator/named_sessions.py), not one of its turns.
    session_naming: str = "explicit"

    def note(self, action: str) -> None:
        self.governor.append(action)

    def cached_estimate(self) -> int:
        """Tokens of the blocks above the first changed one: what the prefix cache should still hold."""
        if (self.first_changed_block is None and self.mode == PASSTHROUGH) or self.first_changed_block == REPLICA:
            return 0
        cached = 0
        for block in self.blocks:
            if block.name == self.first_changed_block or block.name == "query":
                break
            cached += block.tokens
        return cached

    def to_json(self, session_id: str) -> dict[str, Any]:
        report = {"mode": self.mode, "blocks": [block.report() for block in self.blocks],
                  "prefix_sha256": self.prefix_sha256, "first_changed_block": self.first_changed_block,
                  "governor": list(self.governor), "session_id": session_id, "mode_switches": self.mode_switches,
                  "session_naming": self.session_naming}
        if self.codex:
            report["codex"] = [dict(entry) for entry in self.codex]
        return report
