"""`POST /v1/messages`: only HTTP. The route goes ahead of vLLM's on the same path and hands the request
to the MessagesService under the request's log line and trace span, which a stream carries to its end.
`/v1/messages/count_tokens` stays vLLM's: it generates nothing."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from server.chat.serving import ChatService, TurnStream
from server.messages.protocol import MessagesRequest
from server.messages.serving import MessagesService
from server.runtime import Runtime
from server.telemetry.chat_telemetry import ChatTelemetry
from server.tenancy.request_context import current_tenant

PATH = "/v1/messages"


def install_messages_route(app: FastAPI, runtime: Runtime) -> None:
    """Put our route ahead of vLLM's on the same path (Starlette matches routes in order)."""
    service = MessagesService(ChatService(runtime))

    async def create_message(request: MessagesRequest, raw_request: Request) -> Response:
        telemetry = ChatTelemetry(raw_request.headers, door="messages")
        try:
            with telemetry.current():
                response = await service.serve(request, raw_request, current_tenant.get(), telemetry)
        except BaseException as exc:
            telemetry.end(exc)
            raise
        if not isinstance(response, TurnStream):
            telemetry.end()
        return response

    route = APIRoute(PATH, create_message, methods=["POST"], name="ahc_messages", response_model=None)
    for shadowed in app.router.routes:
        if isinstance(shadowed, APIRoute) and shadowed.path == route.path and "POST" in shadowed.methods:
            shadowed.include_in_schema = False  # never reached; ours describes the body with `context`
    app.router.routes.insert(0, route)
