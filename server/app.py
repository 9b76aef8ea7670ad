"""The FastAPI app: vLLM's own OpenAI app, with AHC's routes, error handling and metrics added."""

from __future__ import annotations

from argparse import Namespace
from importlib.metadata import version as package_version
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, APIRouter
from starlette.responses import JSONResponse, Response

from server.admission.recording_gate import RecordingGate
from server.chat.api_router import install_chat_route
from server.emulation.models_route import install_models_route
from server.http.body_limit import BodyLimit
from server.http.gateway import install_gateway
from server.messages.api_router import install_messages_route
from server.responses.api_router import install_responses_route
from server.routes.agent_routes import agent_router
from server.routes.audit_routes import audit_router
from server.routes.browse_routes import AuditVerifier, browse_router
from server.routes.codex_routes import codex_router
from server.routes.completion_route import install_completion_route
from server.routes.context_routes import context_router
from server.routes.export_routes import export_router
from server.routes.karma_routes import karma_router
from server.routes.session_routes import session_router
from server.routes.ui_routes import install_ui
from server.routes.xdb_routes import xdb_router
from server.runtime import Runtime
from server.tenancy.auth import ApiKeyCheck, AuditClosed

if TYPE_CHECKING:
    from vllm.tasks import SupportedTask

# Routes vLLM mounts that AHC does not serve on purpose. They are taken out of the app, not just put
# behind the key: a keyless local server would otherwise serve them to anyone who can reach it.
REMOVED_PATHS: tuple[str, ...] = (
    # Chat by another door. SageMaker's entry point and vLLM's batch chat run vLLM's handlers past
    # AHC's chat route: no orchestrator (sessions, cache report, governors), no VRAM admission. Clients
    # use /v1/chat/completions; making these go through AHC's chat handling is not worth its cost.
    "/invocations",
    "/v1/chat/completions/batch",
    # Token-in/token-out generation for RL and disaggregated serving, past the orchestrator as well, and
    # its abort-by-id, which would let any caller cancel another's request.
    "/inference/v1/generate",
    "/inference/v1/abort_requests",
    # Elastic expert-parallel scaling: AHC runs one engine, sized by its config, and never rescales it.
    "/scale_elastic_ep",
    "/is_scaling_elastic_ep",
    # Hooks that change, pause or stop the engine under AHC's sessions and governor: vLLM's dev mode
    # (VLLM_SERVER_DEV_MODE: cache resets, sleep, collective RPC), its RL weight-update API, runtime
    # LoRA loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING) and SageMaker's adapter routes.
    "/reset_prefix_cache",
    "/reset_mm_cache",
    "/reset_encoder_cache",
    "/collective_rpc",
    "/server_info",
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/release_kv_cache_memory",
    "/get_world_size",
    "/is_paused",
    "/pause",
    "/resume",
    "/abort_requests",
    "/weight_info",
    "/weight_checker",
    "/init_weight_transfer_engine",
    "/shutdown_weight_transfer_engine",
    "/start_weight_update",
    "/start_draft_weight_update",
    "/finish_weight_update",
    "/update_weights",
    "/update_weight_version",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/adapters",
    "/adapters/{adapter_name}",
)


def install_health_route(app: FastAPI, runtime: Runtime) -> None:
    """`/health` is 200 only while both the engine and XDB's writer live, so a supervisor restarts a
    server that can no longer record (placed ahead of vLLM's own `/health`, which asks the engine only).
    A healthy server answers an empty 200, as vLLM does; otherwise the body says what is wrong: recording
    stopped (503), or paused while the disk fails (200: serving goes on, rows are held)."""

    async def health() -> Response:
        state, why = runtime.recorder.recording_state()
        if state == "stopped":
            return JSONResponse({"status": "unhealthy", "recording": state, "reason": why}, status_code=503)
        try:
            await runtime.engine.check_health()
        except Exception as exc:  # vLLM's EngineDeadError, or a dead engine client's own error
            return JSONResponse({"status": "unhealthy", "engine": "dead", "reason": repr(exc)}, status_code=503)
        if state == "paused":
            return JSONResponse({"status": "degraded", "recording": state, "reason": why}, status_code=200)
        return Response(status_code=200)

    app.router.routes.insert(0, APIRoute("/health", health, methods=["GET"], response_class=Response,
                                         include_in_schema=False))


def mount(app: FastAPI, router: APIRouter) -> None:
    """The router's routes, as its decorators built them, at the end of the app's: FastAPI's include_router
    would build every route again (its signature read, a pydantic validator made for each parameter and
    response), about half of what AHC's routes cost an app to start."""
    app.router.routes.extend(router.routes)


def build_app(runtime: Runtime, args: Namespace, supported_tasks: tuple[SupportedTask, ...],
              model_config: Any) -> FastAPI:
    from vllm.entrypoints.launchers.app import build_app as build_vllm_app
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    app = build_vllm_app(args, supported_tasks, model_config)
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in REMOVED_PATHS]
    app.state.ahc_runtime = runtime
    install_health_route(app, runtime)
    if runtime.config.engine.emulate is not None:
        install_models_route(app, runtime.config.engine.emulate)
    install_chat_route(app, runtime)
    install_messages_route(app, runtime)
    install_responses_route(app, runtime)
    install_completion_route(app, runtime)
    mount(app, xdb_router(runtime.xdb, runtime.summarize_records, runtime.config.xdb.bud_min_examples))
    mount(app, agent_router(runtime.xdb))
    mount(app, context_router(runtime.retriever, runtime.xdb, runtime.orchestrator.sessions,
               runtime.identity))
    mount(app, karma_router(runtime.xdb, runtime.karma))
    mount(app, codex_router(runtime.xdb, runtime.codex, runtime.condenser))
    mount(app, export_router(runtime.xdb, runtime.config.xdb.max_exports_per_tenant,
               runtime.config.xdb.export_ttl_s))
    verifier = AuditVerifier(runtime.xdb)
    mount(app, browse_router(runtime.xdb, verifier))
    mount(app, audit_router(runtime.xdb, verifier))
    install_ui(app, model=runtime.config.model_name, emulated=runtime.config.engine.emulate,
               auth_required=bool(runtime.keys),
               version=package_version("ahc"))
    mount(app, session_router(runtime.xdb, runtime.orchestrator.sessions, runtime.background,
               runtime.rag_indexes, runtime.config.engine.max_model_len))
    runtime.metrics.attach(get_prometheus_registry())
    oc = runtime.config.orchestrator
    label = runtime.config.engine_label
    # Outermost, one layer: every response in the shape of the API it was sent to (labelled on the emulated
    # engine), then the key (no route is reached unauthenticated, and an unauthenticated caller learns
    # nothing, not even a 415, before the 401; it sets the request's tenant before anything downstream
    # reads it), then XDB's back-pressure, the body limit, and the JSON content type (with or without a
    # key: a keyless local server is exactly what a cross-site page would target).
    install_gateway(app, label, auth=ApiKeyCheck(runtime.keys) if runtime.keys else AuditClosed(),
                    recording=RecordingGate(runtime.recorder, oc.recording_wait_s, oc.retry_after_s),
                    json_bodies=True, body_limit=BodyLimit(runtime.config.max_request_bytes))
    if label is not None:
        runtime.metrics.engine_emulated.labels(model_name=runtime.metrics.model_name,
                                               profile=runtime.config.engine.emulate).set(1)
    return app
