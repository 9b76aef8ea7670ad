"""`/v1/xdb/*`: the experience database over HTTP, typed bodies and queries, OpenAI-shaped errors
(XDB raises `ahc.errors` exceptions; the server's handler answers them). The audit log has no route.
Each call uses its own cursor of the XDB's connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ahc.errors import PermissionDenied
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
from server.request_context import request_tenant
from server.tenants import Tenant
from xdb import XDBClient
from xdb.documents import DocumentType
from xdb.recall import RecallFilters
from xdb.schema import INT64_MAX

Tick = Annotated[int, Field(ge=0, le=INT64_MAX)]
Caller = Annotated[Tenant, Depends(request_tenant)]


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

    def where(self, tenant: Tenant) -> dict[str, Any]:
        """The target as XDB names it: the session is the tenant's, and so must be a row named by id."""
        return dict(timestep_id=self.timestep_id, session_id=tenant.scope_opt(self.session_id), tick=self.tick,
                    event_id=self.event_id, tick_range=self.tick_range, session_prefix=tenant.prefix)


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
    tokens_before: int | None = Field(None, ge=0, le=INT64_MAX)
    compress_released: bool = False


def xdb_router(xdb: XDBClient, summarize: Callable[[str], str] | None = None) -> APIRouter:
    """The `/v1/xdb/*` routes over one XDB; `summarize` writes compaction summaries (the served model).
    Plain `def` handlers: FastAPI runs them on its thread pool, so DuckDB never blocks the event loop.

    Sessions and documents are the calling tenant's: ids go in scoped and come back as the tenant
    named them (server/tenants.py). Concepts, tag names and buds are the server's shared vocabulary."""
    router = APIRouter(prefix="/v1/xdb", tags=["xdb"], route_class=AHCRoute)

    @router.post("/tag")
    def tag(body: TagBody, tenant: Caller) -> Any:
        return unscoped(tenant, xdb.tag(body.tag, **body.where(tenant), tag_type=body.tag_type,
                                        confidence=body.confidence, source=body.source, note=body.note,
                                        description=body.description))

    @router.post("/comment")
    def comment(body: CommentBody, tenant: Caller) -> Any:
        return unscoped(tenant, xdb.comment(body.content, **body.where(tenant)))

    @router.get("/recall")
    def recall(filters: Annotated[RecallFilters, Query()], tenant: Caller) -> Any:
        scoped = filters.model_copy(update={"session_id": tenant.scope_opt(filters.session_id)})
        rows = xdb.recall(scoped, session_prefix=tenant.prefix)
        return {"object": "list", "data": tenant.unscope_rows(rows, "session_id")}

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
    def documents(tenant: Caller, doc_type: DocumentType | None = None, q: str | None = None) -> Any:
        return {"object": "list", "data": tenant.unscope_rows(xdb.documents(doc_type, q, tenant.prefix), "id")}

    @router.get("/documents/{doc_id}")
    def document(doc_id: str, tenant: Caller,
                 version: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None) -> Any:
        return unscoped(tenant, xdb.document(tenant.scope(doc_id), version=version), "id")

    @router.get("/documents/{doc_id}/versions")
    def document_versions(doc_id: str, tenant: Caller) -> Any:
        return {"object": "list", "data": tenant.unscope_rows(xdb.document_versions(tenant.scope(doc_id)), "id")}

    @router.post("/documents")
    def add_document(body: DocumentBody, tenant: Caller) -> Any:
        return unscoped(tenant, xdb.add_document(**body.model_dump(), id_prefix=tenant.prefix), "id")

    @router.post("/documents/{doc_id}")
    def update_document(doc_id: str, body: DocumentUpdate, tenant: Caller) -> Any:
        return unscoped(tenant, xdb.update_document(tenant.scope(doc_id), **body.model_dump()), "id")

    @router.post("/pin")
    def pin(body: PinBody, tenant: Caller) -> Any:
        return unscoped(tenant, xdb.pin(tenant.scope(body.session_id), body.tick_from, body.tick_to, body.reason))

    @router.post("/compact")
    def compact(body: CompactBody, tenant: Caller) -> Any:
        if tenant.prefix and body.compress_released:
            raise PermissionDenied("compress_released compresses every tenant's released rows: only the server's "
                                   "default tenant may ask for it", param="compress_released")
        result = xdb.compact(**{**body.model_dump(), "session_id": tenant.scope_opt(body.session_id)},
                             summarize=summarize)
        if result.get("compaction") is not None:
            result["compaction"] = unscoped(tenant, result["compaction"])
        return result

    @router.get("/state")
    def state() -> Any:
        return xdb.state()

    return router


def unscoped(tenant: Tenant, row: dict[str, Any], key: str = "session_id") -> dict[str, Any]:
    """One XDB row with its id handed back as the tenant named it (`Tenant.unscope` refuses an id the
    tenant does not own: the lookup was scoped, so that would be a bug, a 500)."""
    return tenant.unscope_rows([row], key)[0]
