"""`/v1/xdb/*`: the experience database over HTTP, typed bodies and queries, OpenAI-shaped errors
(XDB raises `core.errors` exceptions; the server's handler answers them). The audit log has no route.
Each call uses its own cursor of the XDB's connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr

from core.errors import InvalidRequest, NotFound, PermissionDenied
from core.limits import (
    COMMENT_MAX_CHARS,
    DOCUMENT_MAX_TAGS,
    DOCUMENT_NAME_MAX_CHARS,
    DOCUMENT_SUMMARY_MAX_CHARS,
    ID_MAX_CHARS,
    NOTE_MAX_CHARS,
    TAG_MAX_CHARS,
)
from server.http.errors import AHCRoute
from server.tenancy.request_context import Caller
from server.tenancy.tenant_xdb import TenantTarget, TenantViews, TenantXDB
from server.tenancy.tenants import Tenant
from xdb import XDBClient
from xdb.bud_export import bud_training_file
from xdb.documents import DocumentType
from xdb.recall import relations
from xdb.recall.recall import RecallFilters
from xdb.recall.relations import Relation
from xdb.schema import INT64_MAX
from xdb.storage import fidelity
from xdb.tags import BUD_MIN_EXAMPLES, list_buds, search_tags, set_bud_status

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


class TargetBody(_Body):
    timestep_id: int | None = Field(None, ge=0, le=INT64_MAX)
    session_id: str | None = Field(None, max_length=ID_MAX_CHARS)
    tick: int | None = Field(None, ge=0, le=INT64_MAX)
    event_id: str | None = Field(None, max_length=ID_MAX_CHARS)
    tick_range: tuple[Tick, Tick] | None = None

    def target(self) -> TenantTarget:
        return TenantTarget(self.timestep_id, self.session_id, self.tick, self.event_id, self.tick_range)


class TagBody(TargetBody):
    tag: TagRef
    tag_type: Literal["concept", "entity", "bud", "custom"] = "custom"
    confidence: float = Field(1.0, ge=0.0, le=1.0)
    source: Literal["auto", "manual", "inherited"] = "manual"
    note: Note | None = None
    description: Note | None = None
    # What an `entity` tag names (a person, a file, a law...): set when the tag is created.
    entity_type: Annotated[str, Field(min_length=1, max_length=TAG_MAX_CHARS)] | None = None


class CommentBody(TargetBody):
    content: str = Field(min_length=1, max_length=COMMENT_MAX_CHARS)


# Set by a client: submitted, grafted and rejected-by-review follow the bud's evidence (`/evidence`).
BudStatusName = Literal["candidate", "ready", "submitted", "grafted", "rejected"]


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
    # Then rewrite the experience file whole, so deleted sessions' rows leave its blocks (recording waits).
    vacuum: bool = False


def xdb_router(xdb: XDBClient, summarize: Callable[[str], str] | None = None,
               bud_min_examples: int = BUD_MIN_EXAMPLES) -> APIRouter:
    """The `/v1/xdb/*` routes over one XDB; `summarize` writes compaction summaries (the served model).
    Plain `def` handlers: FastAPI runs them on its thread pool, so DuckDB never blocks the event loop.

    Sessions and documents are the calling tenant's, reached through its view (server/tenancy/tenant_xdb.py).
    Concepts, tag names and buds are the server's shared vocabulary."""
    router = APIRouter(prefix="/v1/xdb", tags=["xdb"], route_class=AHCRoute)
    views = TenantViews(xdb)

    @router.post("/tag")
    def tag(body: TagBody, view: TenantXDB = Depends(views)) -> Any:
        return view.tag(body.tag, body.target(), tag_type=body.tag_type, confidence=body.confidence,
                        source=body.source, note=body.note, description=body.description,
                        entity_type=body.entity_type)

    @router.post("/comment")
    def comment(body: CommentBody, view: TenantXDB = Depends(views)) -> Any:
        return view.comment(body.content, body.target())

    def need_lake() -> None:
        if not xdb.has_lake:
            raise InvalidRequest("scope=cluster reads the shared lake: this server runs without one "
                                 "(xdb.backend: duckdb)", param="scope")

    @router.get("/recall")
    def recall(query: Annotated[RecallQuery, Query()], view: TenantXDB = Depends(views)) -> Any:
        """Matching rows oldest first, each with its tags and comments; `has_more` and `next_after_id`
        (pass it as `after_id`) page through the rest. `partial`: xdb.recall_deadline_s came first, and
        the page holds the matches found by then. `scope=cluster`: every replica's rows from the
        lake, each with its `replica` (ids are per replica), up to `limit` (never partial)."""
        filters = RecallFilters.model_validate(query.model_dump(exclude={"scope"}, exclude_unset=True))
        if query.scope == "cluster":
            need_lake()
            return {"object": "list", "data": view.lake_recall(filters), "partial": False}
        return {"object": "list", **view.recall_page(filters)}

    @router.get("/lake")
    def lake_status() -> Any:
        """The shared lake as this replica ships to it: replica id, rows shipped, last ship, last error."""
        need_lake()
        return xdb.lake_status()

    @router.get("/tags")
    def tags_list(scope: Scope = "local",
                  tag_type: Annotated[Literal["concept", "entity", "bud", "custom"] | None, Query()] = None,
                  pattern: Annotated[str | None, Query(min_length=1, max_length=TAG_MAX_CHARS,
                                                       description="a name glob: * any run, ? one character")] = None,
                  bud_status: BudStatusName | None = None,
                  entity_type: Annotated[str | None, Query(min_length=1, max_length=TAG_MAX_CHARS)] = None,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100, view: TenantXDB = Depends(views)) -> Any:
        """The shared vocabulary's tags, by name, each with its applications' count (descriptions, which a
        tenant's agent may have written from its sessions, only for the operator). `scope=cluster`: every
        tag name in the lake with each replica's applications of it."""
        if scope == "cluster":
            need_lake()
            return {"object": "list", "data": xdb.lake_tags(tag_type)}
        found = xdb.read(search_tags, pattern, tag_type, bud_status, entity_type, limit)
        if not view.tenant.operator:
            found = [{**tag, "description": None} for tag in found]
        return {"object": "list", "data": found}

    @router.get("/timesteps/{timestep_id}")
    def get_timestep(timestep_id: Annotated[int, Path(ge=0, le=INT64_MAX)], view: TenantXDB = Depends(views)) -> Any:
        return view.timestep(timestep_id)

    @router.get("/surprising")
    def surprising(session_id: Annotated[str, Query(min_length=1, max_length=ID_MAX_CHARS)],
                   limit: Annotated[int, Query(ge=1, le=1000)] = 20, view: TenantXDB = Depends(views)) -> Any:
        """The session's output tokens whose top activation deviates most from its running mean (z)."""
        return {"object": "list", "session_id": session_id, "data": view.surprising(session_id, limit)}

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
    def related_concepts(concept: str, limit: Annotated[int, Query(ge=1, le=100)] = 10,
                         session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                         relation: Relation | None = None, view: TenantXDB = Depends(views)) -> Any:
        """Each related concept with its `relation`: `parent`, `child` and `sibling` from the concept hierarchy,
        `co_activated` (most often active in the same tokens, in the caller's sessions); `limit` caps each."""
        return {"object": "list", "concept": concept,
                "data": view.related_concepts(concept, limit, session_id, relation)}

    @router.get("/concepts/{concept}/children")
    def concept_children(concept: str) -> Any:
        """The concepts whose parent in the hierarchy is `concept`."""
        return {"object": "list", "concept": concept, "data": xdb.read(relations.concept_children, concept)}

    @router.get("/concepts/{concept}/parents")
    def concept_parents(concept: str) -> Any:
        """`concept`'s ancestors in the hierarchy, its parent first, up to the root."""
        return {"object": "list", "concept": concept, "data": xdb.read(relations.concept_parents, concept)}

    @router.get("/comments")
    def comments(session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                 view: TenantXDB = Depends(views)) -> Any:
        return {"object": "list", "data": view.comments(session_id)}

    @router.get("/windows")
    def windows(session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                view: TenantXDB = Depends(views)) -> Any:
        """Pinned (WARM) and SUBMITTED windows."""
        return {"object": "list", "data": view.windows(session_id)}

    @router.delete("/pin/{window_id}")
    def unpin(window_id: Annotated[int, Path(ge=0, le=INT64_MAX)], view: TenantXDB = Depends(views)) -> Any:
        return view.unpin(window_id)

    @router.post("/evidence")
    def submit_evidence(body: EvidenceBody, tenant: Caller) -> Any:
        """Lock a bud's tagged rows as evidence for a submission (SUBMITTED: never compressed) and write its
        package, DATA_DIR/exports/<submission_id>/ (the windows' rows, the bud's training file, a manifest):
        both or neither. `package` is the package's path."""
        _default_tenant_only(tenant, "evidence")
        submitted = xdb.submit_evidence(body.bud, body.submission_id, bud_min_examples)
        return {"object": "list", "data": submitted["data"], "package": submitted["package"]}

    @router.post("/evidence/{submission_id}/resolve")
    def resolve_submission(submission_id: Annotated[str, Path(max_length=ID_MAX_CHARS)], body: ResolveBody,
                           tenant: Caller) -> Any:
        """Accepted: its windows stay pinned; rejected: released for compression."""
        _default_tenant_only(tenant, "evidence")
        return {"object": "list", "data": xdb.write(fidelity.resolve_submission, submission_id, body.accepted)}

    @router.get("/cold_records")
    def cold_records(session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100, view: TenantXDB = Depends(views)) -> Any:
        """Compressed records, newest first."""
        return {"object": "list", "data": view.cold_records(session_id, limit)}

    @router.get("/buds")
    def buds(status: BudStatusName | None = None, view: TenantXDB = Depends(views)) -> Any:
        """The shared vocabulary's buds; their descriptions (which a tenant's agent may have written from
        its sessions) only for the operator."""
        found = xdb.read(list_buds, status)
        if not view.tenant.operator:
            found = [{**bud, "description": None} for bud in found]
        return {"object": "list", "data": found}

    @router.post("/buds")
    def bud_status(body: BudBody, view: TenantXDB = Depends(views)) -> Any:
        _default_tenant_only(view.tenant, "a bud's status")
        return xdb.write(set_bud_status, body.tag, body.status, bud_min_examples)

    @router.get("/buds/{tag}/examples")
    def bud_examples(tag: Annotated[str, Path(min_length=1, max_length=TAG_MAX_CHARS)], tenant: Caller) -> Any:
        """A ready (or submitted, or grafted) bud's training file for `ahc lens train --examples`: its
        examples against replies it does not tag (xdb/bud_export.py). `tag` is the bud's name."""
        _default_tenant_only(tenant, "a bud's examples")
        return xdb.read(bud_training_file, tag, bud_min_examples)

    @router.get("/documents")
    def documents(doc_type: DocumentType | None = None, q: str | None = None,
                  path: Annotated[str | None, Query(min_length=1, max_length=NOTE_MAX_CHARS,
                                                    description="the document at this path (its latest version)")
                                  ] = None,
                  tag: Annotated[str | None, Query(min_length=1, max_length=TAG_MAX_CHARS,
                                                   description="only the documents carrying this tag")] = None,
                  view: TenantXDB = Depends(views)) -> Any:
        if path is not None:
            try:
                found = [view.find_document(path=path)]
            except NotFound:
                found = []
            return {"object": "list", "data": found}
        return {"object": "list", "data": view.documents(doc_type, q, tag=tag)}

    @router.get("/documents/{doc_id}")
    def document(doc_id: str, version: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None,
                 view: TenantXDB = Depends(views)) -> Any:
        return view.document(doc_id, version=version)

    @router.get("/documents/{doc_id}/versions")
    def document_versions(doc_id: str, view: TenantXDB = Depends(views)) -> Any:
        return {"object": "list", "data": view.document_versions(doc_id)}

    @router.post("/documents")
    def add_document(body: DocumentBody, view: TenantXDB = Depends(views)) -> Any:
        return view.add_document(**body.model_dump())

    @router.post("/documents/{doc_id}")
    def update_document(doc_id: str, body: DocumentUpdate, view: TenantXDB = Depends(views)) -> Any:
        return view.update_document(doc_id, **body.model_dump())

    @router.post("/pin")
    def pin(body: PinBody, view: TenantXDB = Depends(views)) -> Any:
        return view.pin(body.session_id, body.tick_from, body.tick_to, body.reason)

    @router.post("/compact")
    def compact(body: CompactBody, view: TenantXDB = Depends(views)) -> Any:
        if body.compress_released and not view.tenant.operator:
            raise PermissionDenied("compress_released compresses every tenant's released rows: only the server's "
                                   "default tenant may ask for it", param="compress_released")
        if body.session_id is None and not view.tenant.operator:
            raise PermissionDenied("without a session_id this runs the storage pass over every tenant's rows: only "
                                   "the server's default tenant may ask for it", param="session_id")
        if body.vacuum and not view.tenant.operator:
            raise PermissionDenied("vacuum rewrites the whole experience file while every tenant's recording waits: "
                                   "only the server's default tenant may ask for it", param="vacuum")
        result = view.compact(body.session_id, summarize, **body.model_dump(exclude={"session_id", "vacuum"}))
        if body.vacuum:
            result["vacuum"] = xdb.vacuum()
        return result

    @router.get("/state")
    def state(view: TenantXDB = Depends(views)) -> Any:
        _default_tenant_only(view.tenant, "/v1/xdb/state (the whole server's counts)")
        return xdb.state()

    return router


def _default_tenant_only(tenant: Tenant, what: str) -> None:
    if not tenant.operator:
        raise PermissionDenied(f"{what} spans every tenant (buds are the server's shared vocabulary): only the "
                               "server's default tenant may use it")


