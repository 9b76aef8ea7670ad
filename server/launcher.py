"""`ahc serve`: bind the port, start vLLM's engine in-process, serve until SIGTERM, shut down clean.

The socket is bound before the engine starts (as vLLM does) so a busy port fails in a second, not
after the model has loaded; vLLM's `serve_http` drains in-flight requests on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ahc.config import AHCConfig
from ahc.config import resolve_path
from orchestrator.retrieval import CodexRetriever, ScopedIndexes
from orchestrator.template_check import check_chat_template
from orchestrator.session import SessionStore
from server.hidden_calls import HiddenCaller
from server.recorder import Recorder
from server.storage_manager import enforce_quota_forever, model_summarizer
from server.recording_engine import RecordingEngine
from xdb import XDB
from server.app import build_app
from server.services import build_services
from server.engine_args import build_vllm_namespace
from server.capture.capture_setup import CaptureSetup, start_capture
from server.metrics import AHCMetrics, stat_logger_factory
from server.parent_death import mark_server


async def serve(config: AHCConfig) -> None:
    capture = start_capture(config)  # checks the lens pack against the model before anything starts
    try:
        await serve_with(config, capture)
    finally:
        if capture is not None:
            capture.close()


async def serve_with(config: AHCConfig, capture: CaptureSetup | None) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    def interrupt_init(*_: object) -> None:
        raise KeyboardInterrupt("terminated during start-up")

    # uvicorn's handler replaces this once serving; until then SIGTERM must still stop us.
    signal.signal(signal.SIGTERM, interrupt_init)
    args = build_vllm_namespace(config, capture.vllm_flags() if capture else None)
    _, sock = setup_server(args, reuse_port=False)
    metrics = AHCMetrics()
    data_dir = Path(resolve_path(config.data_dir))
    # Opened before the engine: a corrupt or foreign database fails in a second, not after the load.
    xdb = XDB.open(data_dir, on_commit=metrics.xdb_rows_written.inc, quota_bytes=config.xdb.quota_bytes)
    metrics.xdb_queue_depth.set_function(xdb.writer.queue_depth)
    background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ahc-xdb-state")  # in order
    engine = None
    quota_task: asyncio.Task | None = None
    rag_indexes = ScopedIndexes(data_dir / "rag")  # one per session's Codex, opened on first use
    mark_server()  # the engine process vLLM starts next dies with this one (server/parent_death.py)
    try:
        usage = UsageContext.OPENAI_API_SERVER
        vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=usage)
        engine = AsyncLLM.from_vllm_config(
            vllm_config=vllm_config,
            usage_context=usage,
            enable_log_requests=args.enable_log_requests,
            disable_log_stats=args.disable_log_stats,
            stat_loggers=[stat_logger_factory(metrics)],
        )
        supported_tasks = await engine.get_supported_tasks()
        tokenizer = engine.get_tokenizer()
        report_template(tokenizer, metrics, args.chat_template)
        retriever = CodexRetriever(rag_indexes)
        sessions = SessionStore(xdb.load_session_state,
                                lambda sid, state: background.submit(xdb.save_session_state, sid, state))
        services = build_services(config, engine, tokenizer, metrics, sessions, retriever)
        services.recorder = Recorder(xdb, tokenizer, background, capture)
        if capture is not None:  # the pack's concepts and hierarchy, browsable in /v1/xdb/concepts
            background.submit(xdb.register_concepts, capture.pack.concept_hierarchy())
        hidden = HiddenCaller(engine, tokenizer, config.engine.max_model_len)
        xdb.summarize = model_summarizer(hidden, asyncio.get_running_loop(), config.xdb.summary_max_tokens)
        if config.xdb.quota_bytes is not None:
            quota_task = asyncio.create_task(enforce_quota_forever(xdb, config.xdb.quota_check_s))
        app = build_app(config, args, supported_tasks, engine.model_config, metrics, services, xdb)
        await init_app_state(RecordingEngine(engine, services.recorder), app.state, args, supported_tasks)
        shutdown = await serve_http(
            app, sock=sock, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
            access_log=False, timeout_keep_alive=5,
        )
        if quota_task is not None:
            quota_task.cancel()
        engine.shutdown(timeout=config.engine.shutdown_timeout)  # in-flight requests have drained
        engine = None
        await shutdown
    finally:
        if quota_task is not None:
            quota_task.cancel()
        if engine is not None:
            engine.shutdown(timeout=config.engine.shutdown_timeout)
        background.shutdown(wait=True)
        rag_indexes.close()
        xdb.close()  # flushes every queued row
        sock.close()


def report_template(tokenizer, metrics: AHCMetrics, chat_template: str | None) -> None:
    """Warn when the chat template vLLM will use (`--chat-template`, else the model's) would break
    the prefix cache on every turn."""
    if chat_template is not None and Path(chat_template).is_file():
        chat_template = Path(chat_template).read_text()
    check = check_chat_template(lambda messages, tools: tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True, chat_template=chat_template))
    metrics.chat_template_prefix_stable.set(-1 if check.stable is None else int(check.stable))
    if not check.stable:
        logging.getLogger("ahc.serve").warning(
            "the chat template is not prefix-stable, so the prefix cache cannot carry over between turns "
            "(give vLLM a stable one with engine.extra_args: [--chat-template, FILE]): %s", check.detail)
