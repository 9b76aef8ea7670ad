"""What the loop asks of a policy, and what a policy answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.evidence import Evidence
from agent.journal import JournalEntry, ToolCall
from agent.knowledge import Knowledge


@dataclass
class TurnInput:
    turn: int
    query: str  # the user message opening the turn
    messages: list[dict[str, Any]]  # the new messages for the server session (tier 3's increment)
    context: dict[str, Any]  # the request's `context` field (tiers 1 and 2, the session id)
    evidence: Evidence
    knowledge: Knowledge


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def hit_ratio(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass
class Reply:
    note: str  # the LAB NOTE: the policy's reasoning this turn
    calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None  # why the reply holds no usable tool call
    usage: Usage | None = None  # None when no model was asked
    report: dict[str, Any] | None = None  # the server's cache report (`context` of the response)
    stop: bool = False  # the policy has nothing left to try


class ContextOverflow(RuntimeError):
    """The prompt no longer fits the model's window: the loop compacts and asks again."""


class ServerUnreachable(RuntimeError):
    """The model server cannot be reached: the run stops (and can be resumed)."""


class Policy(Protocol):
    name: str
    context_window: int | None  # the model's window in tokens; None without a model
    prompt_size: str  # "full", or "compact" / "minimal" identity and tool schemas for small windows

    @property
    def reply_tokens(self) -> int: ...  # tokens a reply may take (kept free in the window); 0 without a model

    def attach(self, evidence: Evidence) -> None: ...  # the run's evidence (restored on resume)
    def tools(self) -> list[dict[str, Any]]: ...
    def decide(self, turn: TurnInput) -> Reply: ...
    def observe(self, entry: JournalEntry) -> None: ...
    def summarize(self, transcript: str, knowledge: Knowledge) -> str: ...
    def theory(self) -> list[str] | None: ...
    def to_json(self) -> dict[str, Any]: ...
    def load_json(self, data: dict[str, Any]) -> None: ...
