"""`/v1/xdb/*`: the experience database over HTTP, typed bodies and queries, OpenAI-shaped errors
(XDB raises `ahc.errors` exceptions; the server's handler answers them). The audit log has no route.
Each call uses its own cursor of the XDB's connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ahc.limits import (
    COMMENT_MAX_CHARS,
    DOCUMENT_MAX_TAGS,
    DOCUMENT_NAME_MAX_CHARS,
    DOCUMENT_SUMMARY_MAX_CHARS,
    ID_MAX_CHARS,
    NOTE_MAX_CHARS,
    TAG_MAX_CHARS,
)
from server.errors import AHCRoute
from xdb import XDB
from xdb.documents import DocumentType
from xdb.recall import RecallFilters
from xdb.schema import INT64_MAX

Tick = Annotated[int, Field(ge=0, le=INT64_MAX)]


def _tag_ref(tag: str | int) -> str | int:
    # Checked after the union, not in one of its branches, so an error names `tag` itself.
    if isinstance(tag, int) and not 0 <= tag <= INT64_MAX:
        raise ValueError(f"a tag id is between 0 and {INT64_MAX}")
    if isinstance(tag, str) and not 1 <= len(tag) <= TAG_MAX_CHARS:
        raise ValueError(f"a tag name has 1 to {TAG_MAX_CHARS} characters")
    return tag


# A tag by name or by id (a BIGINT): the JSON type decides, a string is a name and an integer an id.
TagRef = Annotated[StrictStr | StrictInt, AfterValidator(_tag_ref)]
Note = Annotated[str, Field(max_length=NOTE_MAX_CHARS)]
Tags = Annotated[list[Annotated[str, Field(max_length=TAG_MAX_CHARS)]], Field(max_length=DOCUMENT_MAX_TAGS)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Target(_Body):
    timestep_id: int | None = Field(None, ge=0, le=INT64_MAX)
    session_id: str | None = Field(None, max_length=ID_MAX_CHARS)
    tick: int | None = Field(None, ge=0, le=INT64_MAX)
    event_id: str | None = Field(None, max_length=ID_MAX_CHARS)
    tick_range: tuple[Tick, Tick] | None = None

    def where(self) -> dict[str, Any]:
        return dict(timestep_id=self.timestep_id, session_id=self.session_id, tick=self.tick,
                    event_id=self.event_id, tick_range=self.tick_range)


class TagBody(Target):
    tag: TagRef
    tag_type: Literal["concept", "entity", "bud", "custom"] = "custom"
    confidence: float = Field(1.0, ge=0.0, le=1.0)
    source: Literal["auto", "manual", "inherited"] = "manual"
    note: Note | None = None
    description: Note | None = None


class CommentBody(Target):
    content: str = Field(min_length=1, max_length=COMMENT_MAX_CHARS)


BudStatusName = Literal["collecting", "ready", "training", "promoted", "abandoned"]


class BudBody(_Body):
    tag: TagRef
    status: BudStatusName


class DocumentBody(_Body):
    name: str = Field(min_length=1, max_length=DOCUMENT_NAME_MAX_CHARS)
    content: str  # sized by XDB itself (xdb.max_document_bytes, 413)
    doc_type: DocumentType = DocumentType.REFERENCE
    path: Note | None = None
    tags: Tags | None = None
    source: Note | None = None
    summary: str | None = Field(None, max_length=DOCUMENT_SUMMARY_MAX_CHARS)


class DocumentUpdate(_Body):
    content: str
    name: str | None = Field(None, min_length=1, max_length=DOCUMENT_NAME_MAX_CHARS)
    summary: str | None = Field(None, max_length=DOCUMENT_SUMMARY_MAX_CHARS)
    tags: Tags | None = None


class PinBody(_Body):
    session_id: str = Field(min_length=1, max_length=ID_MAX_CHARS)
    tick_from: int = Field(ge=0, le=INT64_MAX)
    tick_to: int = Field(ge=0, le=INT64_MAX)
    reason: Note | None = None


class CompactBody(_Body):
    session_id: str | None = Field(None, max_length=ID_MAX_CHARS)
    up_to_tick: int | None = Field(None, ge=0, le=INT64_MAX)
    summary: str | None = Field(None, max_length=DOCUMENT_SUMMARY_MAX_CHARS)
    trigger: Literal["context_full", "manual", "scheduled", "storage_pressure"] = "manual"
    tokens_after: int | None = Field(None, ge=0, le=INT64_MAX)
    compress_released: bool = False


def xdb_router(xdb: XDB, summarize: Callable[[str], str] | None = None) -> APIRouter:
    """The `/v1/xdb/*` routes over one XDB; `summarize` writes compaction summaries (the served model).
    Plain `def` handlers: FastAPI runs them on its thread pool, so DuckDB never blocks the event loop."""
    router = APIRouter(prefix="/v1/xdb", tags=["xdb"], route_class=AHCRoute)

    @router.post("/tag")
    def tag(body: TagBody) -> Any:
        return xdb.tag(body.tag, **body.where(), tag_type=body.tag_type, confidence=body.confidence,
                       source=body.source, note=body.note, description=body.description)

    @router.post("/comment")
    def comment(body: CommentBody) -> Any:
        return xdb.comment(body.content, **body.where())

    @router.get("/recall")
    def recall(filters: Annotated[RecallFilters, Query()]) -> Any:
        return {"object": "list", "data": xdb.recall(filters)}

    @router.get("/concepts")
    def concepts(q: str | None = None) -> Any:
        return {"object": "list", "data": xdb.concepts_list(q)}

    @router.get("/buds")
    def buds(status: BudStatusName | None = None) -> Any:
        return {"object": "list", "data": xdb.buds(status)}

    @router.post("/buds")
    def bud_status(body: BudBody) -> Any:
        return xdb.set_bud_status(body.tag, body.status)

    @router.get("/documents")
    def documents(doc_type: DocumentType | None = None, q: str | None = None) -> Any:
        return {"object": "list", "data": xdb.documents(doc_type, q)}

    @router.get("/documents/{doc_id}")
    def document(doc_id: str, version: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None) -> Any:
        return xdb.document(doc_id, version=version)

    @router.get("/documents/{doc_id}/versions")
    def document_versions(doc_id: str) -> Any:
        return {"object": "list", "data": xdb.document_versions(doc_id)}

    @router.post("/documents")
    def add_document(body: DocumentBody) -> Any:
        return xdb.add_document(**body.model_dump())

    @router.post("/documents/{doc_id}")
    def update_document(doc_id: str, body: DocumentUpdate) -> Any:
        return xdb.update_document(doc_id, **body.model_dump())

    @router.post("/pin")
    def pin(body: PinBody) -> Any:
        return xdb.pin(body.session_id, body.tick_from, body.tick_to, body.reason)

    @router.post("/compact")
    def compact(body: CompactBody) -> Any:
        return xdb.compact(**body.model_dump(), summarize=summarize)

    @router.get("/state")
    def state() -> Any:
        return xdb.state()

    return router
