"""`ahc serve`: bind the port, start vLLM's engine in-process, serve until SIGTERM, shut down clean.

The socket is bound before the engine starts (as vLLM does) so a busy port fails in a second, not
after the model has loaded; vLLM's `serve_http` drains in-flight requests on SIGTERM. With
`--api-server-count N` (N > 1) the serving is done by N API processes over one engine core
(server/api_supervisor.py); each of them, or the one process, serves with server/api_process.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import signal
import tempfile
from pathlib import Path

from core.config import AHCConfig, resolve_path
from server.admission.vram_governor import KVStats
from server.api_process import Served, open_xdb, serve_engine, watch_xdb
from server.capture.capture_setup import CaptureSetup, start_capture
from server.engine_args import build_vllm_namespace, publish_kv_events, with_vllm_flags
from server.engine_process import forked_engine, mark_server, workers_on_one_cpu
from server.metrics import AHCMetrics, stat_logger_factory
from server.recording.backup_signal import install_backup_signal
from server.telemetry.logs import configure_logging
from server.telemetry.tracing import start_tracing
from server.tenancy.tenants import TenantKeys
from xdb.export import note_engine

log = logging.getLogger("ahc.serve")


async def serve(config: AHCConfig, keys: TenantKeys) -> None:
    """`keys`: the config's tenants, built and checked (`serving_keys`) before vLLM is imported."""
    if not config.model:  # named only among the flags passed through: vLLM's parser finds it
        config = with_vllm_flags(config)
    capture = start_capture(config)  # checks the lens pack against the model before anything starts
    try:
        config = with_vllm_flags(config)  # the flags given straight to vLLM count for AHC too
        await serve_with(config, capture, keys)
    finally:
        if capture is not None:
            capture.close()


async def serve_with(config: AHCConfig, capture: CaptureSetup | None, keys: TenantKeys) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.launcher import setup_server
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    def interrupt_init(*_: object) -> None:
        raise KeyboardInterrupt("terminated during start-up")

    # uvicorn's handler replaces this once serving; until then SIGTERM must still stop us.
    signal.signal(signal.SIGTERM, interrupt_init)
    args = build_vllm_namespace(config, capture)
    configure_logging(args)
    if args.api_server_count > 1:  # several API processes over one engine core (server/api_supervisor.py)
        from server.api_supervisor import serve_many

        await serve_many(config, capture, args)
        return
    _, sock = setup_server(args, reuse_port=False)
    metrics = AHCMetrics(KVStats(), config.model_name)
    # Opened before the engine: a corrupt or foreign database fails in a second, not after the load.
    xdb = open_xdb(config, metrics)
    assert xdb.writer is not None  # opened for writing
    if config.engine_label is not None:  # its exports will say an emulated engine wrote here
        xdb.write(note_engine, config.engine_label)
    if capture is not None:  # the writer binds the side channel before the engine's worker starts
        xdb.capture_activations(capture.address, capture.k, capture.finish_wait_s)
        metrics.computed(metrics.one(metrics.lens_receiver_up), lambda: float(bool(xdb.activations_receiving())))
    watch_xdb(config, xdb, metrics)
    engine = None
    # Session admission reads what the cache holds per session from the engine's KV events (the
    # socket's folder is removed in the `finally` below).
    events_dir = tempfile.mkdtemp(prefix="ahc-kv-") if config.orchestrator.session_admission else None
    events_endpoint = publish_kv_events(args, events_dir) if events_dir is not None else None
    mark_server()  # the engine process vLLM starts next dies with this one (server/engine_process.py)
    try:
        usage = UsageContext.OPENAI_API_SERVER
        vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=usage)
        # AHC's tracer provider before the engine's: vLLM's spans then go through it (service `ahc`, usage once).
        start_tracing(vllm_config.observability_config.otlp_traces_endpoint)
        on_cpu = current_platform.is_cpu()
        with forked_engine(on_cpu, fork_workers=on_cpu and workers_on_one_cpu(vllm_config)):
            engine = AsyncLLM.from_vllm_config(
                vllm_config=vllm_config,
                usage_context=usage,
                enable_log_requests=args.enable_log_requests,
                disable_log_stats=args.disable_log_stats,
                stat_loggers=[stat_logger_factory(metrics)],
            )
        install_backup_signal(xdb, Path(resolve_path(config.data_dir)))
        if capture is not None:  # the pack's concepts and hierarchy, browsable in /v1/xdb/concepts
            asyncio.get_running_loop().run_in_executor(None, xdb.register_concepts, capture.visible_hierarchy())
        served = Served(config, keys, capture, args, sock, events_endpoint, primary=True)
        serving, engine = engine, None  # serve_engine shuts it down
        await serve_engine(served, serving, xdb, metrics)
    finally:
        if events_dir is not None:
            shutil.rmtree(events_dir, ignore_errors=True)
        if engine is not None:
            engine.shutdown(timeout=config.engine.shutdown_timeout)
        xdb.close()  # flushes every queued row
        sock.close()
        # vLLM's app froze the start-up heap for serving (gc.freeze). A start-up that failed exits through
        # the interpreter's teardown (a clean stop skips it, `exit_served`): left frozen, the heap's cycles
        # outlive its last collection and keep triton's extension types alive (torch imports triton with
        # vLLM), and nanobind prints a page of "leaked" lines at exit.
        gc.unfreeze()
