"""`POST /v1/responses`: only HTTP. The route goes ahead of vLLM's on the same path and hands the request
to the ResponsesService under the request's log line and trace span. `GET /v1/responses/{id}` and its
cancel stay vLLM's: they generate nothing."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

from server.chat.door import install_ahead, traced
from server.responses.serving import ResponsesService
from server.runtime import Runtime
from server.telemetry.chat_telemetry import ChatTelemetry
from server.tenancy.request_context import current_tenant

PATH = "/v1/responses"


def install_responses_route(app: FastAPI, runtime: Runtime) -> None:
    service = ResponsesService(runtime)

    async def create_response(request: ResponsesRequest, raw_request: Request) -> Response:
        async def serve(telemetry: ChatTelemetry) -> Response:
            return await service.serve(request, raw_request, current_tenant.get(), telemetry)

        return await traced(raw_request, "responses", serve)

    install_ahead(app, APIRoute(PATH, create_response, methods=["POST"], name="ahc_responses", response_model=None))
