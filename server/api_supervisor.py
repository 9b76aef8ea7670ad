"""`ahc serve --api-server-count N`: N API processes over one engine core, as `vllm serve` runs them.

One core is not enough for the API side of a GPU at its peak (detokenizing, streaming, recording each
token), so vLLM lets several API processes share one listening socket and one engine core; the kernel
hands each connection to one of them (the least loaded, vLLM's `peer_loads`). AHC does the same with
vLLM's own parts (the engine's ZMQ listeners, `launch_core_engines`, `APIServerProcessManager`), and
keeps its guarantees across the processes:

- **One XDB service.** This process starts it and restarts it if it dies; every API process attaches
  to it with a stream of its own and its own commit count (xdb/service/remote.py).
- **Sessions.** A session's turns take a lease across processes (server/api_servers/session_lease.py)
  on top of the in-process lock, so they run in order whichever process gets them; a process that
  finds another served the session since drops its cached State and ticks and reads them again.
  Sessions inferred from the messages are looked up in one table every process shares
  (orchestrator/shared_conversations.py).
- **Admission.** Every process's VRAM governor counts every process's reservations, and the engine's
  KV figures (sent by vLLM to process 0 only) reach all of them (server/api_servers/shared_board.py).
- **One metrics view.** Prometheus multiprocess mode, as vLLM's: any process's `/metrics` serves all.

This process owns the socket, the XDB service, the activation side channel, the backup signal and
the engine core; process 0 runs retention and the quota. A process that dies stops the server, as
in vLLM (the others drain their requests, XDB commits what it holds): a supervisor such as systemd
or Docker starts it again, and every session resumes from XDB.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import tempfile
import threading
from argparse import Namespace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from core.config import AHCConfig, resolve_path
from server.api_process import open_xdb
from server.api_servers.group import GroupFiles, WorkerSpec
from server.api_servers.session_lease import SessionLeases
from server.api_servers.shared_board import SharedBoard
from server.capture.capture_setup import CaptureSetup
from server.engine_args import publish_kv_events
from server.engine_process import forked_engine, mark_server
from server.recording.backup_signal import install_backup_signal
from xdb import XDBClient
from xdb.export import note_engine
from xdb.service.remote_xdb import RemoteXDB

if TYPE_CHECKING:
    from vllm.v1.utils import APIServerProcessManager

log = logging.getLogger("ahc.serve")


class ProcessDied(RuntimeError):
    """A process of the server died: it has stopped, every committed row kept."""


async def serve_many(config: AHCConfig, capture: CaptureSetup | None, args: Namespace) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.launcher import setup_server
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
    from vllm.v1.executor import Executor
    from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus
    from vllm.v1.utils import APIServerProcessManager

    from server.api_worker import run_worker

    count: int = args.api_server_count
    if not config.xdb.service_process:
        raise ValueError(f"--api-server-count {count} needs xdb.service_process: true (the API processes share "
                         "one XDB service)")
    setup_multiprocess_prometheus()  # type: ignore[no-untyped-call]  # before any API process imports it
    listen_address, sock = setup_server(args, reuse_port=True)
    directory = tempfile.mkdtemp(prefix="ahc-api-")
    events_dir = tempfile.mkdtemp(prefix="ahc-kv-") if config.orchestrator.session_admission else None
    xdb: XDBClient | None = None
    manager: APIServerProcessManager | None = None
    launch: Any = None
    try:
        files = GroupFiles(directory)
        SessionLeases.create(files.leases)
        SharedBoard.create(files.board, count)
        xdb = open_xdb(config)  # the service (xdb.service_process is on)
        if config.engine_label is not None:  # its exports will say an emulated engine wrote here
            xdb.write(note_engine, config.engine_label)
        if capture is not None:  # the service binds the side channel before the engine's worker starts
            xdb.capture_activations(capture.address, capture.k, capture.finish_wait_s)
            threading.Thread(target=xdb.register_concepts, args=(capture.visible_hierarchy(),),
                             name="ahc-concepts", daemon=True).start()
        install_backup_signal(xdb, Path(resolve_path(config.data_dir)))
        events_endpoint = publish_kv_events(args, events_dir) if events_dir is not None else None
        engine_args = AsyncEngineArgs.from_cli_args(args)
        engine_args._api_process_count = count
        engine_args._api_process_rank = -1
        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        listeners = bind_engine_zmq_listeners(vllm_config, count)
        args.ahc_worker = WorkerSpec(config, capture, events_endpoint, files, cast(RemoteXDB, xdb).service_spec)
        mark_server()  # the engine core and the API processes die with this one (server/engine_process.py)
        with contextlib.ExitStack() as starting:
            with forked_engine(current_platform.is_cpu()):  # only the engine core is forked
                launch = starting.enter_context(launch_core_engines(
                    vllm_config, Executor.get_class(vllm_config), not args.disable_log_stats, listeners.addresses))
            stats = launch.coordinator.get_stats_publish_address() if launch.coordinator else None
            manager = APIServerProcessManager(
                listen_address=listen_address, sock=sock, args=args, num_servers=count,
                input_listeners=listeners.inputs, output_listeners=listeners.outputs,
                target_server_fn=run_worker, stats_update_address=stats, tensor_queue=launch.tensor_queue)
            launch.watched_frontend_processes = manager.processes
        log.info("serving on %s with %d API processes", listen_address, count)
        await until_stopped(manager, launch.engine_manager, launch.coordinator)
    finally:
        timeout = config.engine.shutdown_timeout
        if manager is not None:
            manager.shutdown(timeout=timeout)  # SIGTERM: each drains its requests
        if launch is not None and launch.engine_manager is not None:
            launch.engine_manager.shutdown(timeout=timeout)
        if launch is not None and launch.coordinator is not None:
            launch.coordinator.shutdown(timeout=timeout)
        if xdb is not None:
            xdb.close()  # the API processes' last rows are committed; then the service stops
        sock.close()
        for path in (directory, events_dir):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)


async def until_stopped(manager: APIServerProcessManager, engine_manager: Any, coordinator: Any) -> None:
    """Until SIGTERM or SIGINT, or until a process of the server ends (vLLM's watch: an API process or
    the engine core that dies raises, and the server stops)."""
    from vllm.v1.utils import wait_for_completion_or_failure

    loop = asyncio.get_running_loop()
    done: asyncio.Future[BaseException | None] = loop.create_future()

    def finish(result: BaseException | None) -> None:
        if not done.done():
            done.set_result(result)

    def watch() -> None:
        try:
            wait_for_completion_or_failure(manager, engine_manager, coordinator)
        except BaseException as exc:  # a process died: the server stops, with its reason
            loop.call_soon_threadsafe(finish, exc)
        else:
            loop.call_soon_threadsafe(finish, None)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, finish, None)
    threading.Thread(target=watch, name="ahc-api-watch", daemon=True).start()
    failure = await done
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(signum)
    if failure is not None:
        raise ProcessDied(f"{failure}; the server stopped (start it again: every session resumes from XDB)") \
            from failure
