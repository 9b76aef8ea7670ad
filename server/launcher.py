"""`ahc serve`: bind the port, start vLLM's engine in-process, serve until SIGTERM, shut down clean.

The socket is bound before the engine starts (as vLLM does) so a busy port fails in a second, not
after the model has loaded; vLLM's `serve_http` drains in-flight requests on SIGTERM.
"""

from __future__ import annotations

import signal
from pathlib import Path

from ahc.config import AHCConfig
from ahc.config import resolve_path
from orchestrator.retrieval import CodexIndex, CodexRetriever
from orchestrator.session import SessionStore
from server.app import build_app
from server.services import build_services
from server.engine_args import build_vllm_namespace
from server.metrics import AHCMetrics, stat_logger_factory


async def serve(config: AHCConfig) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    def interrupt_init(*_: object) -> None:
        raise KeyboardInterrupt("terminated during start-up")

    # uvicorn's handler replaces this once serving; until then SIGTERM must still stop us.
    signal.signal(signal.SIGTERM, interrupt_init)
    args = build_vllm_namespace(config)
    _, sock = setup_server(args, reuse_port=False)
    metrics = AHCMetrics()
    usage = UsageContext.OPENAI_API_SERVER
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=usage)
    engine = AsyncLLM.from_vllm_config(
        vllm_config=vllm_config,
        usage_context=usage,
        enable_log_requests=args.enable_log_requests,
        disable_log_stats=args.disable_log_stats,
        stat_loggers=[stat_logger_factory(metrics)],
    )
    try:
        supported_tasks = await engine.get_supported_tasks()
        retriever = CodexRetriever(CodexIndex(Path(resolve_path(config.data_dir)) / "rag.duckdb"))
        services = build_services(config, engine, engine.get_tokenizer(), metrics, SessionStore(), retriever)
        app = build_app(config, args, supported_tasks, engine.model_config, metrics, services)
        await init_app_state(engine, app.state, args, supported_tasks)
        shutdown = await serve_http(
            app, sock=sock, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
            access_log=False, timeout_keep_alive=5,
        )
    finally:
        engine.shutdown(timeout=vllm_config.shutdown_timeout)
    try:
        await shutdown
    finally:
        sock.close()
