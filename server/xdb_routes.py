"""`/v1/xdb/*`: the experience database over HTTP, with OpenAI-shaped errors. The audit log has no
route. Handlers are plain functions, so FastAPI runs them on its thread pool and DuckDB work never
blocks the event loop; each call uses its own cursor of the XDB's connection."""

from __future__ import annotations

from typing import Any, Callable, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from server.errors import error_response
from xdb import XDB, DocumentTooLarge, NotFound, QuotaExceeded, RecallFilterError
from xdb.recall import RecallFilters


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Target(_Body):
    timestep_id: int | None = None
    session_id: str | None = None
    tick: int | None = None
    event_id: str | None = None
    tick_range: tuple[int, int] | None = None

    def where(self) -> dict[str, Any]:
        return dict(timestep_id=self.timestep_id, session_id=self.session_id, tick=self.tick,
                    event_id=self.event_id, tick_range=self.tick_range)


class TagBody(Target):
    tag: str | int
    tag_type: Literal["concept", "entity", "bud", "custom"] = "custom"
    confidence: float = Field(1.0, ge=0.0, le=1.0)
    source: Literal["auto", "manual", "inherited"] = "manual"
    note: str | None = None
    description: str | None = None


class CommentBody(Target):
    content: str = Field(min_length=1)


class BudBody(_Body):
    tag: str | int
    status: Literal["collecting", "ready", "training", "promoted", "abandoned"]


class DocumentBody(_Body):
    name: str = Field(min_length=1)
    content: str
    doc_type: str = "reference"
    path: str | None = None
    tags: list[str] | None = None
    source: str | None = None
    summary: str | None = None


class DocumentUpdate(_Body):
    content: str
    name: str | None = None
    summary: str | None = None
    tags: list[str] | None = None


class PinBody(_Body):
    session_id: str = Field(min_length=1)
    tick_from: int = Field(ge=0)
    tick_to: int = Field(ge=0)
    reason: str | None = None


class CompactBody(_Body):
    session_id: str | None = None
    up_to_tick: int | None = Field(None, ge=0)
    summary: str | None = None
    trigger: Literal["context_full", "manual", "scheduled", "storage_pressure"] = "manual"
    tokens_after: int | None = Field(None, ge=0)
    compress_released: bool = False


class _BadBody(Exception):
    def __init__(self, param: str, message: str) -> None:
        self.param, self.message = param, message


async def _parse(request: Request, model: type[BaseModel]) -> Any:
    try:
        data = await request.json()
    except ValueError:
        raise _BadBody("body", "the body must be a JSON object") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or "body"
        raise _BadBody(param, f"{param}: {err['msg']}") from None


def _errors(call: Callable[[], Any]) -> Any:
    """Run an XDB call, mapping its exceptions to OpenAI-shaped errors."""
    try:
        return call()
    except RecallFilterError as exc:
        return error_response(400, str(exc), param=exc.param)
    except NotFound as exc:
        return error_response(404, str(exc.args[0] if exc.args else exc), type_="not_found_error")
    except DocumentTooLarge as exc:
        return error_response(413, str(exc), param="content")
    except QuotaExceeded as exc:
        return error_response(409, str(exc), type_="quota_exceeded")
    except ValueError as exc:
        return error_response(400, str(exc))


def xdb_router(xdb: XDB | Callable[[], XDB]) -> APIRouter:
    """The `/v1/xdb/*` routes over one XDB (or a function returning it, for late binding)."""
    get = xdb if callable(xdb) and not isinstance(xdb, XDB) else (lambda: xdb)
    router = APIRouter(prefix="/v1/xdb", tags=["xdb"])

    async def body_or_error(request: Request, model: type[BaseModel]) -> Any:
        try:
            return await _parse(request, model)
        except _BadBody as bad:
            return error_response(400, bad.message, param=bad.param)

    @router.post("/tag")
    async def tag(request: Request) -> Any:
        body = await body_or_error(request, TagBody)
        if not isinstance(body, TagBody):
            return body
        return await _threaded(lambda: get().tag(body.tag, **body.where(), tag_type=body.tag_type,
                                                 confidence=body.confidence, source=body.source, note=body.note,
                                                 description=body.description))

    @router.post("/comment")
    async def comment(request: Request) -> Any:
        body = await body_or_error(request, CommentBody)
        if not isinstance(body, CommentBody):
            return body
        return await _threaded(lambda: get().comment(body.content, **body.where()))

    @router.get("/recall")
    def recall(request: Request) -> Any:
        params = request.query_params
        filters: dict[str, Any] = {key: params.getlist(key) if key in ("event_types", "tags") else params[key]
                                   for key in params.keys()}
        return _errors(lambda: {"object": "list", "data": get().recall(RecallFilters.parse(filters))})

    @router.get("/concepts")
    def concepts(q: str | None = None) -> Any:
        return _errors(lambda: {"object": "list", "data": get().concepts_list(q)})

    @router.get("/buds")
    def buds(status: str | None = None) -> Any:
        return _errors(lambda: {"object": "list", "data": get().buds(status)})

    @router.post("/buds")
    async def bud_status(request: Request) -> Any:
        body = await body_or_error(request, BudBody)
        if not isinstance(body, BudBody):
            return body
        return await _threaded(lambda: get().set_bud_status(body.tag, body.status))

    @router.get("/documents")
    def documents(doc_type: str | None = None, q: str | None = None) -> Any:
        return _errors(lambda: {"object": "list", "data": get().documents(doc_type, q)})

    @router.get("/documents/{doc_id}")
    def document(doc_id: str, version: int | None = None) -> Any:
        return _errors(lambda: get().document(doc_id, version=version))

    @router.get("/documents/{doc_id}/versions")
    def document_versions(doc_id: str) -> Any:
        return _errors(lambda: {"object": "list", "data": get().document_versions(doc_id)})

    @router.post("/documents")
    async def add_document(request: Request) -> Any:
        body = await body_or_error(request, DocumentBody)
        if not isinstance(body, DocumentBody):
            return body
        return await _threaded(lambda: get().add_document(**body.model_dump()))

    @router.post("/documents/{doc_id}")
    async def update_document(doc_id: str, request: Request) -> Any:
        body = await body_or_error(request, DocumentUpdate)
        if not isinstance(body, DocumentUpdate):
            return body
        return await _threaded(lambda: get().update_document(doc_id, **body.model_dump()))

    @router.post("/pin")
    async def pin(request: Request) -> Any:
        body = await body_or_error(request, PinBody)
        if not isinstance(body, PinBody):
            return body
        return await _threaded(lambda: get().pin(body.session_id, body.tick_from, body.tick_to, body.reason))

    @router.post("/compact")
    async def compact(request: Request) -> Any:
        body = await body_or_error(request, CompactBody)
        if not isinstance(body, CompactBody):
            return body
        return await _threaded(lambda: get().compact(**body.model_dump()))

    @router.get("/state")
    def state() -> Any:
        return _errors(lambda: get().state())

    return router


async def _threaded(call: Callable[[], Any]) -> Any:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(_errors, call)
