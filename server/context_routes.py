"""`POST /v1/context/query_archive`: where a client runs the `query_archive` tool.

In RAG mode the orchestrator offers the model a `query_archive` tool. Per OpenAI tool semantics the
call comes back to the client (finish_reason "tool_calls"), which executes it here and sends the
result back as a `tool` message — the server never runs a tool behind the client's back, so every
call and result appears in the client's own transcript and in XDB.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from server.errors import error_response


def context_router(retriever) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/context/query_archive")
    async def query_archive(raw_request: Request) -> Response:
        try:
            arguments = json.loads(await raw_request.body())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return error_response(400, f"The request body is not valid JSON: {exc}")
        # Whose Codex to search: the session's (each session has its own index); without one, the
        # Codex of the most recent RAG request.
        scope = arguments.pop("session_id", None) if isinstance(arguments, dict) else None
        if scope is not None and (not isinstance(scope, str) or not scope):
            return error_response(400, "session_id: must be a non-empty string", param="session_id")
        result = await retriever.run_tool(arguments, scope)
        if "error" in result:
            return error_response(400, result["error"]["message"])
        return JSONResponse(result)

    return router
