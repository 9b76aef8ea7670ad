"""The FastAPI app: vLLM's own OpenAI app, with AHC's middleware, routes and metrics added."""

from __future__ import annotations

from argparse import Namespace

from fastapi import FastAPI
from starlette.middleware import Middleware

from ahc.config import AHCConfig
from server.auth import ApiKeyMiddleware
from server.chat_route import install_chat_route
from server.context_routes import context_router
from server.agent_routes import agent_router
from server.xdb_routes import xdb_router
from server.error_shape import ErrorShapeMiddleware
from server.metrics import AHCMetrics
from server.services import Services


def build_app(config: AHCConfig, args: Namespace, supported_tasks: tuple, model_config, metrics: AHCMetrics,
              services: Services, xdb=None) -> FastAPI:
    from vllm.entrypoints.launchers.app import build_app as build_vllm_app
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    app = build_vllm_app(args, supported_tasks, model_config)
    app.state.ahc_config = config
    app.state.ahc_metrics = metrics
    app.state.ahc_services = services
    install_chat_route(app, services.hooks())
    if xdb is not None:
        app.include_router(xdb_router(xdb))
        app.include_router(agent_router(xdb))
    if services.orchestrator.retriever is not None:
        app.include_router(context_router(services.orchestrator.retriever))
    metrics.attach(get_prometheus_registry())
    add_middleware(app, Middleware(ErrorShapeMiddleware))
    if config.api_key:
        # Added last, so it runs first: nothing under /v1 is reached unauthenticated.
        add_middleware(app, Middleware(ApiKeyMiddleware, api_key=config.api_key))
    return app


def add_middleware(app: FastAPI, middleware: Middleware) -> None:
    """Add an outermost middleware even though vLLM's app has already built its stack once."""
    app.user_middleware.insert(0, middleware)
    app.middleware_stack = None  # rebuilt on the first request, with ours in it
