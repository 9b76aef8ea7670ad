"""`POST /v1/context/query_archive`: where a client runs the `query_archive` tool.

In RAG mode the orchestrator offers the model a `query_archive` tool. Per OpenAI tool semantics the
call comes back to the client (finish_reason "tool_calls"), which executes it here and sends the
result back as a `tool` message — the server never runs a tool behind the client's back, so every
call and result appears in the client's own transcript and in XDB.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from ahc.core.errors import InvalidRequest
from orchestrator.retrieval import CodexRetriever
from orchestrator.retrieval.tool import MAX_K, MAX_QUERY_CHARS
from server.http.errors import AHCRoute
from server.tenancy.request_context import request_tenant
from server.tenancy.tenants import Tenant


class QueryArchiveBody(BaseModel):
    """The tool's arguments, plus whose Codex to search: the session's (each session has its own
    index); without one, the Codex of the caller's most recent RAG request."""

    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    k: int = Field(4, ge=1, le=MAX_K)
    session_id: str | None = Field(None, min_length=1, max_length=256)


def context_router(retriever: CodexRetriever) -> APIRouter:
    router = APIRouter(route_class=AHCRoute, tags=["context"])

    @router.post("/v1/context/query_archive")
    async def query_archive(body: QueryArchiveBody, tenant: Annotated[Tenant, Depends(request_tenant)]) -> Any:
        result = await retriever.run_tool(body.model_dump(exclude={"session_id"}), tenant.scope_opt(body.session_id),
                                          tenant.prefix)
        if "error" in result:
            raise InvalidRequest(result["error"]["message"])
        return result

    return router
