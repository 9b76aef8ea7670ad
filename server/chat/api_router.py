"""`POST /v1/chat/completions`: only HTTP. The route goes ahead of vLLM's on the same path, reads the
request once (ChatCall) and hands it to the ChatService under the request's log line and trace span,
which a streamed response carries to its end."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from server.chat.protocol import ChatCall, ChatRequest
from server.chat.serving import ChatService, TurnStream
from server.runtime import Runtime
from server.telemetry.chat_telemetry import ChatTelemetry
from server.tenancy.request_context import current_tenant

PATH = "/v1/chat/completions"


def install_chat_route(app: FastAPI, runtime: Runtime) -> None:
    """Put our route ahead of vLLM's on the same path (Starlette matches routes in order)."""
    service = ChatService(runtime)

    async def chat_completions(request: ChatRequest, raw_request: Request) -> Response:
        return await handle_chat(service, request, raw_request)

    route = APIRoute(PATH, chat_completions, methods=["POST"], name="ahc_chat_completions", response_model=None)
    for shadowed in app.router.routes:
        # vLLM's route is never reached; left in the OpenAPI document it would replace ours there, and the
        # document would describe a body without `context`.
        if isinstance(shadowed, APIRoute) and shadowed.path == route.path and "POST" in shadowed.methods:
            shadowed.include_in_schema = False
    app.router.routes.insert(0, route)


async def handle_chat(service: ChatService, request: ChatRequest, raw_request: Request) -> Response:
    """The request under its log line and trace span (a bad session name included); a stream ends
    them when it is over."""
    telemetry = ChatTelemetry(raw_request.headers)
    try:
        with telemetry.current():
            body = await raw_request.json()  # parsed once by FastAPI already; Starlette keeps it
            call = ChatCall.read(request, body, raw_request.headers, current_tenant.get())
            response = await service.serve(call, raw_request, telemetry)
    except BaseException as exc:
        telemetry.end(exc)
        raise
    if not isinstance(response, TurnStream):
        telemetry.end()
    return response
