"""`POST /v1/chat/completions`: only HTTP. The route goes ahead of vLLM's on the same path, reads the
request once (ChatCall) and hands it to the turn pipeline under the request's log line and trace span,
which a streamed response carries to its end."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from server.chat.protocol import ChatCall, ChatRequest
from server.chat.serving import ChatDoorCall
from server.pipeline.door import install_ahead, traced
from server.pipeline.turn_pipeline import TurnPipeline
from server.runtime import Runtime
from server.telemetry.request_telemetry import RequestTelemetry
from server.tenancy.request_context import current_tenant

PATH = "/v1/chat/completions"


def install_chat_route(app: FastAPI, runtime: Runtime) -> None:
    pipeline = TurnPipeline(runtime)

    async def chat_completions(request: ChatRequest, raw_request: Request) -> Response:
        async def serve(telemetry: RequestTelemetry) -> Response:
            body = await raw_request.json()  # parsed once by FastAPI already; Starlette keeps it
            call = ChatCall.read(request, body, raw_request.headers, current_tenant.get())
            return await pipeline.serve(ChatDoorCall(call), raw_request, telemetry)

        return await traced(raw_request, "chat", serve)  # a bad session name is in the request's span too

    install_ahead(app, APIRoute(PATH, chat_completions, methods=["POST"], name="ahc_chat_completions",
                                response_model=None))
