"""One API process of `ahc serve --api-server-count N` (server/api_supervisor.py): vLLM's engine
client for its index among N, XDB through the supervisor's service, and the same runtime and app as
the one process of a plain `ahc serve`, serving on the shared socket."""

from __future__ import annotations

import asyncio
import logging
import socket
from argparse import Namespace
from typing import Any

from server.admission.vram_governor import KVStats
from server.api_process import Served, exit_served, open_xdb, serve_engine, watch_xdb
from server.api_servers.group import ApiGroup, WorkerSpec
from server.api_servers.shared_board import SharedBoard
from server.metrics import AHCMetrics, stat_logger_factory
from server.telemetry.logs import configure_logging
from server.telemetry.tracing import start_tracing
from server.tenancy.tenants import TenantKeys

log = logging.getLogger("ahc.serve")

# How often the engine's KV figures go from process 0 to the others, and this process's computed gauges
# are written for the multiprocess /metrics.
SHARE_EVERY_S = 0.02
METRICS_EVERY_S = 1.0


def run_worker(listen_address: str, sock: socket.socket, args: Namespace, client_config: dict[str, Any]) -> None:
    """The API process's entry point (vLLM's APIServerProcessManager starts it, spawned)."""
    import uvloop
    from vllm.utils.system_utils import decorate_logs, set_process_title

    index = int(client_config.get("client_index", 0))
    set_process_title("APIServer", str(index))
    decorate_logs()
    configure_logging(args)
    try:
        uvloop.run(serve_worker(sock, args, client_config))
    except KeyboardInterrupt:
        pass
    exit_served()


async def serve_worker(sock: socket.socket, args: Namespace, client_config: dict[str, Any]) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    spec: WorkerSpec = args.ahc_worker
    config = spec.config
    client_config = dict(client_config)
    index, count = int(client_config.pop("client_index")), int(client_config.pop("client_count"))
    loads = client_config.pop("api_server_loads", None)
    group = ApiGroup(index, count, spec.files, spec.xdb)
    keys = TenantKeys.build(config.api_key, config.api_keys_file)
    metrics = AHCMetrics(KVStats(), config.model_name)
    xdb = open_xdb(config, metrics, attach=group.xdb)
    tasks: list[asyncio.Task[None]] = []
    try:
        watch_xdb(config, xdb, metrics)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        engine_args._api_process_count, engine_args._api_process_rank = count, index
        usage = UsageContext.OPENAI_API_SERVER
        vllm_config = engine_args.create_engine_config(usage_context=usage)
        start_tracing(vllm_config.observability_config.otlp_traces_endpoint)
        engine = AsyncLLM.from_vllm_config(
            vllm_config=vllm_config, usage_context=usage, enable_log_requests=args.enable_log_requests,
            disable_log_stats=args.disable_log_stats, stat_loggers=[stat_logger_factory(metrics)],
            client_addresses=client_config, client_count=count, client_index=index)
        board = SharedBoard(group.files.board, index)
        tasks.append(asyncio.create_task(share_kv_stats(board, metrics.kv_stats, publish=index == 0)))
        tasks.append(asyncio.create_task(metrics.refresh_forever(METRICS_EVERY_S)))
        served = Served(config, keys, spec.capture, args, sock, spec.events_endpoint, primary=group.primary,
                        peer_loads=(loads, index) if loads is not None else None, group=group)
        await serve_engine(served, engine, xdb, metrics)
    finally:
        for task in tasks:
            task.cancel()
        xdb.close()  # its rows committed; the service goes on for the others
        sock.close()


async def share_kv_stats(board: SharedBoard, stats: KVStats, publish: bool) -> None:
    """vLLM sends the engine's scheduler stats (the KV cache's usage) to API process 0 alone: it publishes
    them, the others read them, so every VRAM governor and session admission weighs the same cache."""
    while True:
        if publish:
            board.publish_kv(stats)
        else:
            board.read_kv(stats)
        await asyncio.sleep(SHARE_EVERY_S)
