"""The `context` field a chat request may carry, validated so a bad one is a 400 naming
the field rather than a silently different prompt."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ahc.errors import InvalidRequest
from ahc.limits import ID_MAX_CHARS, IDENTITY_MAX_CHARS, KARMA_MAX_ENTRIES, KARMA_TEXT_MAX_CHARS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CodexDoc(_Strict):
    id: str = Field(min_length=1, max_length=ID_MAX_CHARS)
    text: str  # sized by RagLimits (orchestrator/retrieval/limits.py): 413, configurable


class KarmaEntry(_Strict):
    id: str = Field(min_length=1, max_length=ID_MAX_CHARS)
    text: str = Field(max_length=KARMA_TEXT_MAX_CHARS)
    # Verbatim facts are never pruned or condensed by the governors or compaction.
    verbatim: bool = False


class ContextSpec(_Strict):
    session_id: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)
    identity: str | None = Field(None, max_length=IDENTITY_MAX_CHARS)
    codex: list[CodexDoc] = Field(default_factory=list)
    karma: list[KarmaEntry] = Field(default_factory=list, max_length=KARMA_MAX_ENTRIES)
    mode: Literal["auto", "cag", "rag"] = "auto"
    # This request's share of the window under which auto mode picks CAG (None: the config's). Strict, so
    # `true` or "0.5" is refused rather than read as a number.
    cag_threshold: float | None = Field(None, gt=0, le=1, strict=True)
    formatter: str | None = None

    @field_validator("codex", "karma")
    @classmethod
    def _unique_ids(cls, items: list[CodexDoc] | list[KarmaEntry]) -> list[CodexDoc] | list[KarmaEntry]:
        ids = [item.id for item in items]
        if len(ids) != len(set(ids)):
            raise ValueError("ids must be unique")
        return items


def parse_context(raw: Any) -> ContextSpec:
    """Validate a `context` from Python; raises InvalidRequest naming the bad field (`context.codex.0.id`).
    Over HTTP the chat request's typed body validates it instead."""
    try:
        return ContextSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(["context", *(str(part) for part in first["loc"])])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise InvalidRequest(f"{path}: {message}", param=path) from None
