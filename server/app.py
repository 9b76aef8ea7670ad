"""The FastAPI app: vLLM's own OpenAI app, with AHC's routes, error handling and metrics added."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.middleware import Middleware
from starlette.responses import Response

from server.agent_routes import agent_router
from server.auth import ApiKeyMiddleware
from server.body_limit import BodyLimitMiddleware
from server.chat_route import install_chat_route
from server.context_routes import context_router
from server.errors import add_middleware, install_error_handling
from server.runtime import Runtime
from server.xdb_routes import xdb_router


def install_health_route(app: FastAPI, runtime: Runtime) -> None:
    """`/health` is 200 only while both the engine and XDB's writer live, so a supervisor restarts a
    server that can no longer record (placed ahead of vLLM's own `/health`, which asks the engine only)."""

    async def health() -> Response:
        if not runtime.recorder.alive:
            return Response(status_code=503)
        try:
            await runtime.engine.check_health()
        except Exception:  # vLLM's EngineDeadError, or a dead engine client's own error
            return Response(status_code=503)
        return Response(status_code=200)

    app.router.routes.insert(0, APIRoute("/health", health, methods=["GET"], response_class=Response,
                                         include_in_schema=False))


def build_app(runtime: Runtime, args: Namespace, supported_tasks: tuple[str, ...], model_config: Any) -> FastAPI:
    from vllm.entrypoints.launchers.app import build_app as build_vllm_app
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    app = build_vllm_app(args, supported_tasks, model_config)
    app.state.ahc_runtime = runtime
    install_health_route(app, runtime)
    install_chat_route(app, runtime)
    app.include_router(xdb_router(runtime.xdb, runtime.summarize_records))
    app.include_router(agent_router(runtime.xdb))
    app.include_router(context_router(runtime.retriever))
    runtime.metrics.attach(get_prometheus_registry())
    install_error_handling(app)
    add_middleware(app, Middleware(BodyLimitMiddleware, max_bytes=runtime.config.max_request_bytes))
    if runtime.config.api_key:
        # Added last, so it runs first: nothing under /v1 is reached unauthenticated.
        add_middleware(app, Middleware(ApiKeyMiddleware, api_key=runtime.config.api_key))
    return app
