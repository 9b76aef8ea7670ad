"""The `context` field a chat request may carry (SPEC §4.1), validated so a bad one is a 400 naming
the field rather than a silently different prompt."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CodexDoc(_Strict):
    id: str = Field(min_length=1, max_length=256)
    text: str


class KarmaEntry(_Strict):
    id: str = Field(min_length=1, max_length=256)
    text: str
    # Verbatim facts are never pruned or condensed by the governors or compaction.
    verbatim: bool = False


class ContextSpec(_Strict):
    session_id: str | None = Field(None, min_length=1, max_length=256)
    identity: str | None = None
    codex: list[CodexDoc] = Field(default_factory=list)
    karma: list[KarmaEntry] = Field(default_factory=list)
    mode: Literal["auto", "cag", "rag"] = "auto"
    formatter: str | None = None


def parse_context(raw: Any) -> ContextSpec:
    """Validate a request's `context`; raises ValueError whose first word is the bad field's path."""
    if not isinstance(raw, dict):
        raise ValueError("context: must be a JSON object")
    try:
        spec = ContextSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(["context", *(str(part) for part in first["loc"])])
        raise ValueError(f"{path}: {first['msg']}") from None
    for field, items in (("codex", spec.codex), ("karma", spec.karma)):
        ids = [item.id for item in items]
        if len(ids) != len(set(ids)):
            raise ValueError(f"context.{field}: ids must be unique")
    return spec


def field_of(error: ValueError) -> str:
    """The field path a `parse_context` error names (its text before the first colon)."""
    return str(error).split(":", 1)[0]
