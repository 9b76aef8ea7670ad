"""`POST /v1/messages`: only HTTP. The route goes ahead of vLLM's on the same path and hands the request
to the MessagesService under the request's log line and trace span. `/v1/messages/count_tokens` stays
vLLM's: it generates nothing."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from server.messages.protocol import MessagesRequest
from server.messages.serving import MessagesService
from server.pipeline.door import install_ahead, traced
from server.pipeline.turn_pipeline import TurnPipeline
from server.runtime import Runtime
from server.telemetry.request_telemetry import RequestTelemetry
from server.tenancy.request_context import current_tenant

PATH = "/v1/messages"


def install_messages_route(app: FastAPI, runtime: Runtime) -> None:
    service = MessagesService(TurnPipeline(runtime))

    async def create_message(request: MessagesRequest, raw_request: Request) -> Response:
        async def serve(telemetry: RequestTelemetry) -> Response:
            return await service.serve(request, raw_request, current_tenant.get(), telemetry)

        return await traced(raw_request, "messages", serve)

    install_ahead(app, APIRoute(PATH, create_message, methods=["POST"], name="ahc_messages", response_model=None))
