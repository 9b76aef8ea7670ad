"""`ahc serve`: bind the port, start vLLM's engine in-process, serve until SIGTERM, shut down clean.

The socket is bound before the engine starts (as vLLM does) so a busy port fails in a second, not
after the model has loaded; vLLM's `serve_http` drains in-flight requests on SIGTERM.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from ahc.core.config import AHCConfig, resolve_path
from server.admission.cache_events import CacheEvents, follow
from server.admission.vram_governor import KVStats
from server.capture.capture_setup import CaptureSetup, start_capture
from server.engine_args import build_vllm_namespace, kv_events_replay, publish_kv_events, with_vllm_flags
from server.engine_process import forked_engine, mark_server
from server.metrics import AHCMetrics, stat_logger_factory
from server.model.template_check import check_chat_template
from server.recording.backup_signal import install_backup_signal
from server.recording.quota_loop import enforce_quota_forever
from server.runtime import Runtime, build_runtime
from server.telemetry.logs import configure_logging
from server.telemetry.tracing import start_tracing
from server.tenancy.tenants import TenantKeys
from xdb import XDB, XDBClient
from xdb.export import note_engine
from xdb.remote import RECORDING_STATES, RemoteXDB
from xdb.schema import EXPERIENCE_FILE
from xdb.store import AUDIT_FILE

if TYPE_CHECKING:  # vLLM is imported when the engine starts, not with this module
    from vllm.engine.protocol import EngineClient
    from vllm.renderers.chat_utils import ChatCompletionMessageParam
    from vllm.tokenizers.protocol import TokenizerLike

# On SIGTERM vLLM stops the engine (draining in-flight requests up to engine.shutdown_timeout) before the
# HTTP server shuts down; a response still open after that waits on tokens that will never come, so the
# HTTP server ends it after these seconds rather than waiting forever.
GRACE_AFTER_ENGINE_S = 5

log = logging.getLogger("ahc.serve")


async def serve(config: AHCConfig) -> None:
    keys = TenantKeys.build(config.api_key, config.api_keys_file)  # a bad keys file fails before the model loads
    check_tenancy(keys)
    if not config.model:  # named only among the flags passed through: vLLM's parser finds it
        config = with_vllm_flags(config)
    capture = start_capture(config)  # checks the lens pack against the model before anything starts
    try:
        config = with_vllm_flags(config)  # the flags given straight to vLLM count for AHC too
        await serve_with(config, capture, keys)
    finally:
        if capture is not None:
            capture.close()


def exit_served() -> NoReturn:
    """Exit 0 once `serve` has returned, without the interpreter's teardown: the server closed all it
    opened, and freeing the module graph of torch and vLLM object by object costs ~2 s of CPU at every
    stop. The exit handlers still run (spans are flushed, logs closed)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


async def serve_with(config: AHCConfig, capture: CaptureSetup | None, keys: TenantKeys) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server
    from vllm.platforms import current_platform
    from vllm.renderers.chat_utils import load_chat_template
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from server.app import build_app  # imports vLLM's OpenAI layer: after the lens pack is checked

    def interrupt_init(*_: object) -> None:
        raise KeyboardInterrupt("terminated during start-up")

    # uvicorn's handler replaces this once serving; until then SIGTERM must still stop us.
    signal.signal(signal.SIGTERM, interrupt_init)
    args = build_vllm_namespace(config, capture)
    configure_logging(args)
    _, sock = setup_server(args, reuse_port=False)
    metrics = AHCMetrics(KVStats(), config.model_name)
    # Opened before the engine: a corrupt or foreign database fails in a second, not after the load.
    xdb = open_xdb(config, metrics)
    assert xdb.writer is not None  # opened for writing
    if config.engine_label is not None:  # its exports will say an emulated engine wrote here
        xdb.write(note_engine, config.engine_label)
    if capture is not None:  # the writer binds the side channel before the engine's worker starts
        xdb.capture_activations(capture.address, capture.k, capture.finish_wait_s)
        metrics.one(metrics.lens_receiver_up).set_function(lambda: float(bool(xdb.activations_receiving())))
    metrics.one(metrics.xdb_queue_depth).set_function(xdb.writer.queue_depth)
    writer = xdb.writer
    for state in RECORDING_STATES:
        metrics.xdb_recording.labels(model_name=metrics.model_name, state=state).set_function(
            functools.partial(lambda s: float(writer.recording_state()[0] == s), state))
    metrics.one(metrics.audit_head_seq).set_function(lambda: xdb.audit_head()[0])
    metrics.one(metrics.audit_chain_verified).set_function(lambda: {None: -1.0, True: 1.0, False: 0.0}[
        xdb.audit_verified()])
    metrics.watch_xdb_files(Path(resolve_path(config.data_dir)), [Path(EXPERIENCE_FILE), AUDIT_FILE])
    engine = None
    runtime: Runtime | None = None
    quota_task: asyncio.Task[None] | None = None
    events_task: asyncio.Task[None] | None = None
    # Session admission reads what the cache holds per session from the engine's KV events (the
    # socket's folder is removed in the `finally` below).
    events_dir = tempfile.mkdtemp(prefix="ahc-kv-") if config.orchestrator.session_admission else None
    events_endpoint = publish_kv_events(args, events_dir) if events_dir is not None else None
    cache_events = CacheEvents() if events_endpoint is not None else None
    mark_server()  # the engine process vLLM starts next dies with this one (server/engine_process.py)
    try:
        usage = UsageContext.OPENAI_API_SERVER
        vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=usage)
        # AHC's tracer provider before the engine's: vLLM's spans then go through it (service `ahc`, usage once).
        start_tracing(vllm_config.observability_config.otlp_traces_endpoint)
        with forked_engine(current_platform.is_cpu()):
            engine = AsyncLLM.from_vllm_config(
                vllm_config=vllm_config,
                usage_context=usage,
                enable_log_requests=args.enable_log_requests,
                disable_log_stats=args.disable_log_stats,
                stat_loggers=[stat_logger_factory(metrics)],
            )
        supported_tasks = await engine.get_supported_tasks()
        chat_template = load_chat_template(args.chat_template)  # a path or the template itself, as vLLM reads it
        runtime = build_runtime(config, engine, xdb, metrics, capture, chat_template=chat_template, keys=keys,
                                cache_events=cache_events)
        if cache_events is not None and events_endpoint is not None:
            events_task = asyncio.create_task(follow(events_endpoint, cache_events, kv_events_replay(args)))
            metrics.one(metrics.session_cache_sessions).set_function(
                lambda: float(cache_events.sessions() if cache_events.trusted else -1))
            metrics.one(metrics.kv_events_undecodable).set_function(lambda: float(cache_events.undecodable))
        report_template(runtime.tokenizer, metrics, chat_template)
        install_backup_signal(xdb, Path(resolve_path(config.data_dir)))
        if capture is not None:  # the pack's concepts and hierarchy, browsable in /v1/xdb/concepts
            runtime.background.submit(xdb.register_concepts, capture.pack.concept_hierarchy())
        if not config.xdb.keep_forever:  # retention and the quota
            quota_task = asyncio.create_task(enforce_quota_forever(
                xdb, config.xdb.quota_check_s, runtime.summarize_records, metrics.record_storage_pass,
                config.xdb.vacuum_every_s))
        app = build_app(runtime, args, supported_tasks, engine.model_config)
        # The recording wrapper stands in for the engine by delegation, which vLLM's nominal type cannot see.
        await init_app_state(cast("EngineClient", runtime.engine), app.state, args, supported_tasks)
        runtime.hidden.serving = app.state.openai_serving_chat  # renders hidden calls as vLLM renders chats
        shutdown = await serve_http(
            app, sock=sock, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
            access_log=False, timeout_keep_alive=5, timeout_graceful_shutdown=GRACE_AFTER_ENGINE_S,
        )
        if quota_task is not None:
            quota_task.cancel()
        engine.shutdown(timeout=config.engine.shutdown_timeout)  # in-flight requests have drained
        engine = None
        await shutdown
    finally:
        for task in (quota_task, events_task):
            if task is not None:
                task.cancel()
        if events_dir is not None:
            shutil.rmtree(events_dir, ignore_errors=True)
        if engine is not None:
            engine.shutdown(timeout=config.engine.shutdown_timeout)
        if runtime is not None:
            runtime.close()
        xdb.close()  # flushes every queued row
        sock.close()
        # vLLM's app froze the start-up heap for serving (gc.freeze). A start-up that failed exits through
        # the interpreter's teardown (a clean stop skips it, `exit_served`): left frozen, the heap's cycles
        # outlive its last collection and keep triton's extension types alive (torch imports triton with
        # vLLM), and nanobind prints a page of "leaked" lines at exit.
        gc.unfreeze()


def open_xdb(config: AHCConfig, metrics: AHCMetrics) -> XDBClient:
    """XDB for the server, its quota sized from the data dir's disk when the config names none."""
    data_dir = Path(resolve_path(config.data_dir))
    quota = config.xdb.sized_quota(data_dir)
    if quota is not None and quota != config.xdb.quota_bytes:
        log.info("XDB quota: %.1f GB (%.0f%% of the data dir's disk; xdb.quota_bytes sets one)", quota / 1e9,
                 100 * config.xdb.disk_quota_share)
        config = config.with_overrides(**{"xdb.quota_bytes": quota})
    if config.xdb.service_process:
        remote = RemoteXDB(data_dir, config.xdb, on_commit=metrics.one(metrics.xdb_rows_written).inc,
                           on_restart=metrics.one(metrics.xdb_service_restarts).inc)
        return cast(XDBClient, remote)  # it serves XDB's interface (xdb/interface.py), call for call
    return XDB.open(data_dir, config.xdb, on_commit=metrics.one(metrics.xdb_rows_written).inc)


def check_tenancy(keys: TenantKeys) -> None:
    """vLLM's stored Responses (`VLLM_ENABLE_RESPONSES_API_STORE`) are kept by response id for anyone
    who asks: with several tenants, one could read another's. Refuse the combination."""
    import os

    tenants = keys.tenants
    if len(tenants) > 1 and os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "0") not in ("", "0"):
        raise ValueError("VLLM_ENABLE_RESPONSES_API_STORE keeps responses readable by any key: unset it to serve "
                         f"several tenants ({len(tenants)} configured)")


def report_template(tokenizer: TokenizerLike, metrics: AHCMetrics, chat_template: str | None) -> None:
    """Warn when the chat template vLLM will use (`--chat-template`, loaded, else the model's) would
    break the prefix cache on every turn."""
    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        # The messages are OpenAI chat dicts, which vLLM's signature names by its TypedDicts.
        chat = cast("list[ChatCompletionMessageParam]", messages)
        prompt = tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True,
                                               chat_template=chat_template)
        return cast(str, prompt)  # tokenize=False: the text, not token ids

    check = check_chat_template(render)
    metrics.one(metrics.chat_template_prefix_stable).set(-1 if check.stable is None else int(check.stable))
    if not check.stable:
        logging.getLogger("ahc.serve").warning(
            "the chat template is not prefix-stable, so the prefix cache cannot carry over between turns "
            "(give vLLM a stable one with engine.extra_args: [--chat-template, FILE]): %s", check.detail)
