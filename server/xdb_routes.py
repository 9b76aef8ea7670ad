"""`/v1/xdb/*`: the experience database over HTTP, typed bodies and queries, OpenAI-shaped errors
(XDB raises `ahc.errors` exceptions; the server's handler answers them). The audit log has no route.
Each call uses its own cursor of the XDB's connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ahc.errors import InvalidRequest, NotFound, PermissionDenied
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
from server.request_context import Caller
from server.tenants import Tenant
from xdb import XDBClient
from xdb.documents import DocumentType
from xdb.recall import RecallFilters
from xdb.schema import INT64_MAX

Tick = Annotated[int, Field(ge=0, le=INT64_MAX)]
# `local`: this server's own XDB; `cluster`: the shared lake, every replica's rows (xdb.backend ducklake).
Scope = Annotated[Literal["local", "cluster"], Query(description="local: this server's XDB; cluster: the lake")]


class RecallQuery(RecallFilters):
    """Recall's query string: the filters, and where to look (one query model: FastAPI takes no other
    query parameter beside one)."""

    scope: Literal["local", "cluster"] = "local"


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
                    event_id=self.event_id, tick_range=self.tick_range, session_prefix=tenant.owner)


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


class EvidenceBody(_Body):
    bud: TagRef
    submission_id: str = Field(min_length=1, max_length=ID_MAX_CHARS)


class ResolveBody(_Body):
    accepted: bool


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

    def need_lake() -> None:
        if getattr(xdb, "lake", None) is None:
            raise InvalidRequest("scope=cluster reads the shared lake: this server runs without one "
                                 "(xdb.backend: duckdb)", param="scope")

    @router.get("/recall")
    def recall(query: Annotated[RecallQuery, Query()], tenant: Caller) -> Any:
        """Matching rows oldest first, each with its tags and comments; `has_more` and `next_after_id`
        (pass it as `after_id`) page through the rest. `scope=cluster`: every replica's rows from the
        lake, each with its `replica` (ids are per replica), up to `limit`."""
        filters = RecallFilters.model_validate(query.model_dump(exclude={"scope"}, exclude_unset=True))
        scoped = filters.model_copy(update={"session_id": tenant.scope_opt(filters.session_id)})
        if query.scope == "cluster":
            need_lake()
            rows = xdb.lake_recall(scoped, session_prefix=tenant.owner)
            return {"object": "list", "data": tenant.unscope_rows(rows, "session_id")}
        page = xdb.recall_page(scoped, session_prefix=tenant.owner)
        return {"object": "list", **page, "data": tenant.unscope_rows(page["data"], "session_id")}

    @router.get("/lake")
    def lake_status() -> Any:
        """The shared lake as this replica ships to it: replica id, rows shipped, last ship, last error."""
        need_lake()
        return xdb.lake_status()

    @router.get("/tags")
    def tags_list(scope: Annotated[Literal["cluster"], Query(description="the lake's tags, every replica's")],
                  tag_type: Annotated[str | None, Query(max_length=TAG_MAX_CHARS)] = None) -> Any:
        """Every tag name in the lake with each replica's applications of it."""
        need_lake()
        return {"object": "list", "data": xdb.lake_tags(tag_type)}

    @router.get("/timesteps/{timestep_id}")
    def get_timestep(timestep_id: Annotated[int, Path(ge=0, le=INT64_MAX)], tenant: Caller) -> Any:
        return unscoped(tenant, xdb.timestep(timestep_id, session_prefix=tenant.owner))

    @router.get("/surprising")
    def surprising(session_id: Annotated[str, Query(min_length=1, max_length=ID_MAX_CHARS)], tenant: Caller,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> Any:
        """The session's output tokens whose top activation deviates most from its running mean (z)."""
        return {"object": "list", "session_id": session_id,
                "data": xdb.surprising(tenant.scope(session_id), limit)}

    @router.get("/concepts")
    def concepts(q: str | None = None,
                 parent: Annotated[str | None, Query(description='children of this concept ("" for roots)')] = None,
                 scope: Scope = "local") -> Any:
        if scope == "cluster":
            need_lake()
            if parent is not None:
                raise InvalidRequest("parent is not available with scope=cluster", param="parent")
            return {"object": "list", "data": xdb.lake_concepts(q)}
        return {"object": "list", "data": xdb.concepts_list(q, parent)}

    @router.get("/concepts/{concept}/related")
    def related_concepts(concept: str, tenant: Caller, limit: Annotated[int, Query(ge=1, le=100)] = 10,
                         session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None) -> Any:
        """Concepts most often active in the same tokens as `concept` (in the caller's sessions)."""
        return {"object": "list", "concept": concept, "data": xdb.related_concepts(
            concept, limit, tenant.scope_opt(session_id), tenant.owner)}

    @router.get("/comments")
    def comments(tenant: Caller, session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None) -> Any:
        rows = [r for r in xdb.comments(tenant.scope_opt(session_id)) if tenant.owns(r["session_id"])]
        return {"object": "list", "data": tenant.unscope_rows(rows, "session_id")}

    @router.get("/windows")
    def windows(tenant: Caller, session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None) -> Any:
        """Pinned (WARM) and SUBMITTED windows."""
        rows = [w for w in xdb.windows(tenant.scope_opt(session_id)) if tenant.owns(w["session_id"])]
        return {"object": "list", "data": tenant.unscope_rows(rows, "session_id")}

    @router.delete("/pin/{window_id}")
    def unpin(window_id: Annotated[int, Path(ge=0, le=INT64_MAX)], tenant: Caller) -> Any:
        if not any(w["id"] == window_id and tenant.owns(w["session_id"]) for w in xdb.windows()):
            raise NotFound(f"window {window_id} not found")
        return unscoped(tenant, xdb.unpin(window_id))

    @router.post("/evidence")
    def submit_evidence(body: EvidenceBody, tenant: Caller) -> Any:
        """Lock a bud's tagged rows as evidence for a submission (SUBMITTED: never compressed)."""
        _default_tenant_only(tenant, "evidence")
        return {"object": "list", "data": xdb.submit_evidence(body.bud, body.submission_id)}

    @router.post("/evidence/{submission_id}/resolve")
    def resolve_submission(submission_id: Annotated[str, Path(max_length=ID_MAX_CHARS)], body: ResolveBody,
                           tenant: Caller) -> Any:
        """Accepted: its windows stay pinned; rejected: released for compression."""
        _default_tenant_only(tenant, "evidence")
        return {"object": "list", "data": xdb.resolve_submission(submission_id, body.accepted)}

    @router.get("/cold_records")
    def cold_records(tenant: Caller, session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
        """Compressed records, newest first."""
        if tenant.owner and session_id is None:
            raise InvalidRequest("session_id is required (records are listed per session)", param="session_id")
        rows = xdb.cold_records(tenant.scope_opt(session_id), limit)
        return {"object": "list", "data": tenant.unscope_rows(rows, "session_id") if tenant.owner else rows}

    @router.get("/buds")
    def buds(status: BudStatusName | None = None) -> Any:
        return {"object": "list", "data": xdb.buds(status)}

    @router.post("/buds")
    def bud_status(body: BudBody) -> Any:
        return xdb.set_bud_status(body.tag, body.status)

    @router.get("/documents")
    def documents(tenant: Caller, doc_type: DocumentType | None = None, q: str | None = None,
                  path: Annotated[str | None, Query(min_length=1, max_length=NOTE_MAX_CHARS,
                                                    description="the document at this path (its latest version)")
                                  ] = None) -> Any:
        if path is not None:
            try:
                found = [xdb.find_document(path=path, id_prefix=tenant.owner)]
            except NotFound:
                found = []
            return {"object": "list", "data": tenant.unscope_rows(found, "id")}
        return {"object": "list", "data": tenant.unscope_rows(xdb.documents(doc_type, q, tenant.owner), "id")}

    @router.get("/documents/{doc_id}")
    def document(doc_id: str, tenant: Caller,
                 version: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None) -> Any:
        return unscoped(tenant, xdb.document(tenant.scope(doc_id), version=version), "id")

    @router.get("/documents/{doc_id}/versions")
    def document_versions(doc_id: str, tenant: Caller) -> Any:
        return {"object": "list", "data": tenant.unscope_rows(xdb.document_versions(tenant.scope(doc_id)), "id")}

    @router.post("/documents")
    def add_document(body: DocumentBody, tenant: Caller) -> Any:
        return unscoped(tenant, xdb.add_document(**body.model_dump(), id_prefix=tenant.owner), "id")

    @router.post("/documents/{doc_id}")
    def update_document(doc_id: str, body: DocumentUpdate, tenant: Caller) -> Any:
        return unscoped(tenant, xdb.update_document(tenant.scope(doc_id), **body.model_dump()), "id")

    @router.post("/pin")
    def pin(body: PinBody, tenant: Caller) -> Any:
        return unscoped(tenant, xdb.pin(tenant.scope(body.session_id), body.tick_from, body.tick_to, body.reason))

    @router.post("/compact")
    def compact(body: CompactBody, tenant: Caller) -> Any:
        if body.compress_released and not tenant.operator:
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


def _default_tenant_only(tenant: Tenant, what: str) -> None:
    if not tenant.operator:
        raise PermissionDenied(f"{what} spans every tenant's sessions (buds are the server's shared vocabulary): "
                               "only the server's default tenant may use it")


def unscoped(tenant: Tenant, row: dict[str, Any], key: str = "session_id") -> dict[str, Any]:
    """One XDB row with its id handed back as the tenant named it (`Tenant.unscope` refuses an id the
    tenant does not own: the lookup was scoped, so that would be a bug, a 500)."""
    return tenant.unscope_rows([row], key)[0]
