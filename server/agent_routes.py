"""The discovery agent's tables over HTTP: `interaction_log` and `meta_knowledge` in the server's XDB.

The server owns its DuckDB file (one writing process per file), so an agent running against it logs
its turns and knowledge snapshots here instead of opening the file (agent/run_store.py is the
client). Routes, under `/v1/xdb`:

    POST   /interactions      {run_id, journal_entry?, tool_call_json?, tool_result_json?, token_count?} -> {turn_id}
    GET    /interactions      ?run_id=&pattern=&after_turn=&last=  -> {object: list, data: [rows]}
    POST   /meta_knowledge    {run_id, theorems_json?, negative_knowledge?, last_compacted_turn?} -> {version_id}
    GET    /meta_knowledge    ?run_id=&all=false  -> {object: list, data: [latest] or every version}
    DELETE /runs/{run_id}     -> {deleted: {interaction_log: n, meta_knowledge: n}}  (a fresh run's reset;
                              run_id percent-encoded, an escaped "/" included)

Bodies and queries are typed: bad input is a 400 naming the parameter; an unknown run is an empty
list, never a 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from server.errors import AHCRoute
from server.request_context import Caller
from xdb import XDBClient
from xdb.schema import INT32_MAX, INT64_MAX

RUN_ID = Field(min_length=1, max_length=256)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InteractionBody(_Body):
    run_id: str = RUN_ID
    journal_entry: str | None = None
    tool_call_json: str | None = None
    tool_result_json: str | None = None
    token_count: int | None = Field(None, ge=0, le=INT32_MAX)  # an INTEGER column


class KnowledgeBody(_Body):
    run_id: str = RUN_ID
    theorems_json: str | None = None
    negative_knowledge: str | None = None
    last_compacted_turn: int | None = Field(None, ge=0, le=INT64_MAX)


def agent_router(xdb: XDBClient) -> APIRouter:
    """The routes over one XDB. Plain `def` handlers run on FastAPI's thread pool, off the event loop.
    A run is the calling tenant's: its id goes in scoped and comes back as the tenant named it."""
    router = APIRouter(prefix="/v1/xdb", tags=["agent"], route_class=AHCRoute)

    @router.post("/interactions")
    def log_interaction(body: InteractionBody, tenant: Caller) -> Any:
        return {"turn_id": xdb.log_interaction(tenant.scope(body.run_id), **body.model_dump(exclude={"run_id"}))}

    @router.get("/interactions")
    def interactions(run_id: Annotated[str, Query(min_length=1, max_length=256)], tenant: Caller,
                     pattern: str | None = None,
                     after_turn: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
                     last: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None) -> Any:
        rows = xdb.interactions(tenant.scope(run_id), pattern=pattern or None, after_turn=after_turn, last=last)
        return {"object": "list", "data": tenant.unscope_rows(rows, "run_id")}

    @router.post("/meta_knowledge")
    def save_meta_knowledge(body: KnowledgeBody, tenant: Caller) -> Any:
        return {"version_id": xdb.save_meta_knowledge(tenant.scope(body.run_id),
                                                      **body.model_dump(exclude={"run_id"}))}

    @router.get("/meta_knowledge")
    def meta_knowledge(run_id: Annotated[str, Query(min_length=1, max_length=256)], tenant: Caller,
                       all: bool = False) -> Any:  # noqa: A002 (the query parameter's name)
        rows = xdb.meta_knowledge(tenant.scope(run_id), latest=not all)
        return {"object": "list", "data": tenant.unscope_rows(rows, "run_id")}

    # `:path` so a run id with an escaped `/` (%2F, decoded before routing) still reaches this route.
    @router.delete("/runs/{run_id:path}")
    def purge(run_id: str, tenant: Caller) -> Any:
        return {"run_id": run_id, "deleted": xdb.purge_run(tenant.scope(run_id))}

    return router
