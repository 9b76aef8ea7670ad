"""The discovery agent's tables over HTTP: `interaction_log` and `meta_knowledge` in the server's XDB.

The server owns its DuckDB file (one writing process per file), so an agent running against it logs
its turns and knowledge snapshots here instead of opening the file (agent/run_store.py is the
client). Routes, under `/v1/xdb`:

    POST   /interactions      {run_id, journal_entry?, tool_call_json?, tool_result_json?, token_count?} -> {turn_id}
    GET    /interactions      ?run_id=&pattern=&after_turn=&last=  -> {object: list, data: [rows]}
    POST   /meta_knowledge    {run_id, theorems_json?, negative_knowledge?, last_compacted_turn?} -> {version_id}
    GET    /meta_knowledge    ?run_id=&all=false  -> {object: list, data: [latest] or every version}
    DELETE /runs/{run_id}     -> {deleted: {interaction_log: n, meta_knowledge: n}}  (a fresh run's reset)

Bad input is a 400 in OpenAI's error shape; an unknown run is an empty list, never a 404.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from server.errors import error_response

RUN_ID = Field(min_length=1, max_length=256)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InteractionBody(_Body):
    run_id: str = RUN_ID
    journal_entry: str | None = None
    tool_call_json: str | None = None
    tool_result_json: str | None = None
    token_count: int | None = Field(None, ge=0)


class KnowledgeBody(_Body):
    run_id: str = RUN_ID
    theorems_json: str | None = None
    negative_knowledge: str | None = None
    last_compacted_turn: int | None = Field(None, ge=0)


def agent_router(xdb: Any | Callable[[], Any]) -> APIRouter:
    """The routes over one XDB (or a zero-argument function returning it, for late binding)."""
    from xdb import XDB

    get = xdb if callable(xdb) and not isinstance(xdb, XDB) else (lambda: xdb)
    router = APIRouter(prefix="/v1/xdb", tags=["agent"])

    @router.post("/interactions")
    async def log_interaction(request: Request) -> Any:
        body = await _parse(request, InteractionBody)
        if not isinstance(body, InteractionBody):
            return body
        fields = body.model_dump(exclude={"run_id"})
        return await _threaded(lambda: {"turn_id": get().log_interaction(body.run_id, **fields)})

    @router.get("/interactions")
    def interactions(run_id: str | None = None, pattern: str | None = None, after_turn: str | None = None,
                     last: str | None = None) -> Any:
        if not run_id:
            return error_response(400, "run_id: required", param="run_id")
        numbers = {}
        for name, raw in (("after_turn", after_turn), ("last", last)):
            if raw is not None:
                if not raw.isdigit() or (name == "last" and int(raw) < 1):
                    return error_response(400, f"{name}: must be a {'positive' if name == 'last' else 'non-negative'} "
                                          f"integer, got {raw!r}", param=name)
                numbers[name] = int(raw)
        return _errors(lambda: {"object": "list",
                                "data": get().interactions(run_id, pattern=pattern or None, **numbers)})

    @router.post("/meta_knowledge")
    async def save_meta_knowledge(request: Request) -> Any:
        body = await _parse(request, KnowledgeBody)
        if not isinstance(body, KnowledgeBody):
            return body
        fields = body.model_dump(exclude={"run_id"})
        return await _threaded(lambda: {"version_id": get().save_meta_knowledge(body.run_id, **fields)})

    @router.get("/meta_knowledge")
    def meta_knowledge(run_id: str | None = None, all: bool = False) -> Any:  # noqa: A002 (query name)
        if not run_id:
            return error_response(400, "run_id: required", param="run_id")
        return _errors(lambda: {"object": "list", "data": get().meta_knowledge(run_id, latest=not all)})

    @router.delete("/runs/{run_id}")
    def purge(run_id: str) -> Any:
        return _errors(lambda: {"run_id": run_id, "deleted": get().purge_run(run_id)})

    return router


async def _parse(request: Request, model: type[BaseModel]) -> Any:
    """The validated body, or the 400 response naming what was wrong."""
    try:
        data = await request.json()
    except ValueError:
        return error_response(400, "the body must be a JSON object", param="body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or "body"
        return error_response(400, f"{param}: {err['msg']}", param=param)


def _errors(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ValueError as exc:
        return error_response(400, str(exc))


async def _threaded(call: Callable[[], Any]) -> Any:
    # DuckDB work runs on the thread pool, never on the event loop.
    return await run_in_threadpool(_errors, call)
