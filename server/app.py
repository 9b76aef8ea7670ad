"""The FastAPI app: vLLM's own OpenAI app, with AHC's middleware, routes and metrics added."""

from __future__ import annotations

from argparse import Namespace

from fastapi import FastAPI

from ahc.config import AHCConfig
from server.auth import ApiKeyMiddleware
from server.metrics import AHCMetrics


def build_app(config: AHCConfig, args: Namespace, supported_tasks: tuple, model_config, metrics: AHCMetrics) -> FastAPI:
    from vllm.entrypoints.launchers.app import build_app as build_vllm_app
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    app = build_vllm_app(args, supported_tasks, model_config)
    app.state.ahc_config = config
    app.state.ahc_metrics = metrics
    metrics.attach(get_prometheus_registry())
    if config.api_key:
        # Added last, so it runs first: nothing under /v1 is reached unauthenticated.
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    return app
