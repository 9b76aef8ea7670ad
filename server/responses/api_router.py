"""`/v1/responses`: only HTTP. The routes go ahead of vLLM's on the same paths and hand the request to
the ResponsesService: a new response under the request's log line and trace span; a stored one read
back or deleted. Cancel stays vLLM's (it cancels background responses, which AHC does not store)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

from server.pipeline.door import install_ahead, traced
from server.responses.serving import ResponsesService
from server.runtime import Runtime
from server.telemetry.request_telemetry import RequestTelemetry
from server.tenancy.request_context import current_tenant

PATH = "/v1/responses"


def install_responses_route(app: FastAPI, runtime: Runtime) -> None:
    service = ResponsesService(runtime)

    async def create_response(request: ResponsesRequest, raw_request: Request) -> Response:
        async def serve(telemetry: RequestTelemetry) -> Response:
            return await service.serve(request, raw_request, current_tenant.get(), telemetry)

        return await traced(raw_request, "responses", serve)

    async def retrieve_response(response_id: str, stream: bool = False) -> Response:
        return JSONResponse(await service.retrieve(response_id, current_tenant.get(), stream))

    async def delete_response(response_id: str) -> Response:
        return JSONResponse(await service.delete(response_id, current_tenant.get()))

    install_ahead(app, APIRoute(PATH, create_response, methods=["POST"], name="ahc_responses", response_model=None))
    install_ahead(app, APIRoute(PATH + "/{response_id}", retrieve_response, methods=["GET"],
                                name="ahc_retrieve_response", response_model=None))
    install_ahead(app, APIRoute(PATH + "/{response_id}", delete_response, methods=["DELETE"],
                                name="ahc_delete_response", response_model=None))
