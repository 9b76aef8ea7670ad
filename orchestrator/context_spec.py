"""The `context` field a chat request may carry, validated so a bad one is a 400 naming
the field rather than a silently different prompt."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from core.errors import InvalidRequest
from core.limits import (
    ID_MAX_CHARS,
    IDENTITY_MAX_CHARS,
    KARMA_MAX_ENTRIES,
    KARMA_TEXT_MAX_CHARS,
    TAG_MAX_CHARS,
)
from orchestrator.memory_tools import MemoryToolName


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SHA256_PATTERN = r"^[0-9a-f]{64}$"


class CodexDoc(_Strict):
    id: str = Field(min_length=1, max_length=ID_MAX_CHARS)
    text: str  # sized by RagLimits (orchestrator/retrieval/limits.py): 413, configurable
    # A verbatim document is never condensed: its exact words matter (a spec, a contract).
    verbatim: bool = False
    # A shorter rendition of the same text, used in its place when the prompt needs room before the
    # orchestrator would switch to RAG. The server fills it from XDB's stored renditions.
    condensed: str | None = None


class StoredCodexDoc(CodexDoc):
    """A Codex entry the server read from an XDB document version (never sent by a client): the
    version it rendered, for the cache report."""

    document: str  # the document's id
    version: int
    sha256: str  # of `text`
    condensed_version: str | None = None  # the rendition document's id@version, when `condensed` is set


class CodexRef(_Strict):
    """A Codex entry by reference to an XDB document: uploaded once (`POST /v1/xdb/documents`), then
    named here and rendered byte-identically from the stored version, so the request stays small and
    the prefix stays cached. `document` is its id or its name; without `version` or `sha256`, the latest."""

    document: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)
    version: int | None = Field(None, ge=1, strict=True)
    sha256: str | None = Field(None, pattern=SHA256_PATTERN)
    id: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)  # its name in the prompt (default: name)
    verbatim: bool = False

    @model_validator(mode="after")
    def _names_one(self) -> CodexRef:
        if self.document is None and self.sha256 is None:
            raise ValueError("a Codex entry needs `text`, or `document` (an XDB document's id or name) "
                             "or `sha256` to name a stored version")
        if self.version is not None and self.sha256 is not None:
            raise ValueError("give `version` or `sha256`, not both")
        if self.version is not None and self.document is None:
            raise ValueError("`version` needs `document`")
        return self


class CodexSet(_Strict):
    """Every XDB document carrying `tag`, each as its own Codex entry in the order of its path (then name): a
    directory or codebase tree loaded by `ahc codex load` (tag `codex:NAME`), without naming its files."""

    tag: str = Field(min_length=1, max_length=TAG_MAX_CHARS)
    verbatim: bool = False


def _codex_kind(value: Any) -> str:
    """A reference names a document or a hash, a set a tag; anything else is read (and reported on) as
    inline text."""
    if isinstance(value, CodexSet) or (isinstance(value, dict) and set(value) <= {"tag", "verbatim"}
                                       and "tag" in value):
        return "[set]"
    if isinstance(value, CodexRef) or (isinstance(value, dict) and "text" not in value
                                       and ("document" in value or "sha256" in value)):
        return "[ref]"
    return "[text]"


# Tags in brackets: pydantic puts them in an error's `loc`, where they are not field names and are dropped.
CodexEntry = Annotated[Annotated[CodexDoc, Tag("[text]")] | Annotated[CodexRef, Tag("[ref]")]
                       | Annotated[CodexSet, Tag("[set]")], Discriminator(_codex_kind)]


class KarmaEntry(_Strict):
    id: str = Field(min_length=1, max_length=ID_MAX_CHARS)
    text: str = Field(max_length=KARMA_TEXT_MAX_CHARS)
    # Verbatim facts are never pruned or condensed by the governors or compaction.
    verbatim: bool = False


class ContextSpec(_Strict):
    session_id: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)
    identity: str | None = Field(None, max_length=IDENTITY_MAX_CHARS)
    codex: list[CodexEntry] = Field(default_factory=list)
    karma: list[KarmaEntry] = Field(default_factory=list, max_length=KARMA_MAX_ENTRIES)
    mode: Literal["auto", "cag", "rag"] = "auto"
    # This request's share of the window under which auto mode picks CAG (None: the config's). Strict, so
    # `true` or "0.5" is refused rather than read as a number.
    cag_threshold: float | None = Field(None, gt=0, le=1, strict=True)
    formatter: str | None = None
    # XDB's verbs offered to the model as tools (orchestrator/memory_tools.py); none unless named.
    memory_tools: list[MemoryToolName] = Field(default_factory=list)

    @field_validator("memory_tools")
    @classmethod
    def _named_once(cls, names: list[MemoryToolName]) -> list[MemoryToolName]:
        if len(names) != len(set(names)):
            raise ValueError("each tool is named once")
        return names

    @field_validator("codex", "karma")
    @classmethod
    def _unique_ids(cls, items: list[CodexDoc | CodexRef | CodexSet] | list[KarmaEntry]
                    ) -> list[CodexDoc | CodexRef | CodexSet] | list[KarmaEntry]:
        # A reference's name is known once resolved, a set's members' once listed.
        ids = [i for item in items if (i := getattr(item, "id", None)) is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("ids must be unique")
        return items

    def documents(self) -> list[CodexDoc]:
        """The Codex as documents; a reference left unresolved (no server to read XDB) is an error."""
        docs = [doc for doc in self.codex if isinstance(doc, CodexDoc)]
        if len(docs) != len(self.codex):
            raise InvalidRequest("context.codex: entries naming an XDB document are resolved by the server; "
                                 "give `text` here", param="context.codex")
        return docs


def parse_context(raw: Any) -> ContextSpec:
    """Validate a `context` from Python; raises InvalidRequest naming the bad field (`context.codex.0.id`).
    Over HTTP the chat request's typed body validates it instead."""
    try:
        return ContextSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(["context", *(str(part) for part in first["loc"] if "[" not in str(part))])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise InvalidRequest(f"{path}: {message}", param=path) from None
