"""What an API process serves with: the runtime and the app on a started engine client, XDB opened for
it, and the gauges that read them. The one process of `ahc serve` serves with it (server/launcher.py),
and so does each of several with `--api-server-count` (server/api_worker.py)."""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import socket
import sys
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import psutil

from core.config import AHCConfig, resolve_path
from server.admission.cache_events import CacheEvents, follow
from server.capture.capture_setup import CaptureSetup
from server.engine_args import kv_events_replay
from server.metrics import AHCMetrics
from server.model.template_check import check_chat_template
from server.recording.backup_loop import backup_forever
from server.recording.quota_loop import enforce_quota_forever
from server.runtime import Runtime, build_runtime
from server.tenancy.tenants import TenantKeys
from xdb import XDB, XDBClient
from xdb.schema import EXPERIENCE_FILE
from xdb.service.remote import RECORDING_STATES
from xdb.service.remote_xdb import RemoteXDB
from xdb.service.service import ServiceSpec
from xdb.store import AUDIT_FILE

if TYPE_CHECKING:  # vLLM is imported when the engine starts, not with this module
    from vllm.engine.protocol import EngineClient
    from vllm.renderers.chat_utils import ChatCompletionMessageParam
    from vllm.tokenizers.protocol import TokenizerLike
    from vllm.v1.engine.async_llm import AsyncLLM

    from server.api_servers.group import ApiGroup

# On SIGTERM vLLM stops the engine (draining in-flight requests up to engine.shutdown_timeout) before the
# HTTP server shuts down; a response still open after that waits on tokens that will never come, so the
# HTTP server ends it after these seconds rather than waiting forever.
GRACE_AFTER_ENGINE_S = 5

log = logging.getLogger("ahc.serve")


def exit_served() -> NoReturn:
    """Exit 0 once `serve` has returned, without the interpreter's teardown: the server closed all it
    opened, and freeing the module graph of torch and vLLM object by object costs ~2 s of CPU at every
    stop. The exit handlers still run (spans are flushed, logs closed)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@dataclass
class Served:
    """What an API process serves with, besides its engine client and XDB: the same for the one process of
    `ahc serve` and for each of several (`--api-server-count`)."""

    config: AHCConfig
    keys: TenantKeys
    capture: CaptureSetup | None
    args: Namespace  # vLLM's, as parsed
    sock: socket.socket  # bound already
    events_endpoint: str | None  # the engine's KV events, read by session admission (None: not read)
    primary: bool  # runs the server-wide loops (retention and the quota); one process does
    peer_loads: tuple[Any, int] | None = None  # the API processes' open connections, this one's index
    group: ApiGroup | None = None  # the API processes this one serves among (None: it serves alone)


async def serve_engine(served: Served, engine: AsyncLLM, xdb: XDBClient, metrics: AHCMetrics) -> None:
    """Build the runtime and the app on a started engine client and serve until SIGTERM; shuts the engine
    client down once in-flight requests have drained, and closes what the runtime opened."""
    from vllm.entrypoints.launchers import launcher
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.launcher import serve_http
    from vllm.renderers.chat_utils import load_chat_template

    from server.app import build_app  # imports vLLM's OpenAI layer: after the lens pack is checked

    config, args = served.config, served.args
    runtime: Runtime | None = None
    tasks: list[asyncio.Task[None]] = []
    cache_events = CacheEvents() if served.events_endpoint is not None else None
    engine_open = True
    try:
        supported_tasks = await engine.get_supported_tasks()
        chat_template = load_chat_template(args.chat_template)  # a path or the template itself, as vLLM reads it
        runtime = build_runtime(config, engine, xdb, metrics, served.capture, chat_template=chat_template,
                                keys=served.keys, cache_events=cache_events, group=served.group)
        if cache_events is not None and served.events_endpoint is not None:
            tasks.append(asyncio.create_task(follow(served.events_endpoint, cache_events, kv_events_replay(args))))
            metrics.computed(metrics.one(metrics.session_cache_sessions),
                             lambda: float(cache_events.sessions() if cache_events.trusted else -1))
            metrics.computed(metrics.one(metrics.kv_events_undecodable), lambda: float(cache_events.undecodable))
        report_template(runtime.tokenizer, metrics, chat_template)
        if served.primary:  # retention and the quota (none with keep_forever), segments and erasures
            tasks.append(asyncio.create_task(enforce_quota_forever(
                xdb, config.xdb.quota_check_s, runtime.summarize_records, metrics.record_storage_pass,
                config.xdb.erase_within_s)))
        if served.primary:  # erasures from backups and exports left pending; scheduled backups (xdb.backup_every_s)
            tasks.append(asyncio.create_task(backup_forever(xdb, Path(resolve_path(config.data_dir)), config.xdb)))
        app = build_app(runtime, args, supported_tasks, engine.model_config)
        # The recording wrapper stands in for the engine by delegation, which vLLM's nominal type cannot see.
        await init_app_state(cast("EngineClient", runtime.engine), app.state, args, supported_tasks)
        runtime.hidden.serving = app.state.openai_serving_chat  # renders hidden calls as vLLM renders chats
        # At a cancelled shutdown vLLM logs the command line of whatever holds the port; a child that has just
        # exited (a zombie not yet reaped) made that log line raise, and the server exit 1 after a clean drain.
        found = launcher.__dict__["find_process_using_port"]
        launcher.__dict__["find_process_using_port"] = functools.partial(live_process_using_port, found)
        shutdown = await serve_http(
            app, sock=served.sock, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
            access_log=False, timeout_keep_alive=5, timeout_graceful_shutdown=GRACE_AFTER_ENGINE_S,
            peer_loads=served.peer_loads,
        )
        for task in tasks:
            task.cancel()
        engine_open = False
        engine.shutdown(timeout=config.engine.shutdown_timeout)  # in-flight requests have drained
        await shutdown
    finally:
        for task in tasks:
            task.cancel()
        if engine_open:
            engine.shutdown(timeout=config.engine.shutdown_timeout)
        if runtime is not None:
            runtime.close()


def watch_xdb(config: AHCConfig, xdb: XDBClient, metrics: AHCMetrics) -> None:
    """The gauges that read this process's XDB writer and the database's files when scraped."""
    assert xdb.writer is not None
    metrics.computed(metrics.one(metrics.xdb_queue_depth), xdb.writer.queue_depth)
    writer = xdb.writer
    for state in RECORDING_STATES:
        metrics.computed(metrics.xdb_recording.labels(model_name=metrics.model_name, state=state),
                         functools.partial(lambda s: float(writer.recording_state()[0] == s), state))
    metrics.computed(metrics.one(metrics.audit_head_seq), lambda: xdb.audit_head()[0])
    metrics.computed(metrics.one(metrics.audit_chain_verified), lambda: {None: -1.0, True: 1.0, False: 0.0}[
        xdb.audit_verified()])
    metrics.watch_xdb_files(Path(resolve_path(config.data_dir)), [Path(EXPERIENCE_FILE), AUDIT_FILE])


def open_xdb(config: AHCConfig, metrics: AHCMetrics | None = None, attach: ServiceSpec | None = None) -> XDBClient:
    """XDB for the server, its quota sized from the data dir's disk when the config names none; `metrics`
    count its commits and the service's restarts; `attach`: the running XDB service to write through (one
    of several API processes), instead of starting one."""
    data_dir = Path(resolve_path(config.data_dir))
    quota = config.xdb.sized_quota(data_dir)
    if quota is not None and quota != config.xdb.quota_bytes:
        if attach is None:
            log.info("XDB quota: %.1f GB (%.0f%% of the data dir's disk; xdb.quota_bytes sets one)", quota / 1e9,
                     100 * config.xdb.disk_quota_share)
        config = config.with_overrides(**{"xdb.quota_bytes": quota})
    on_commit = metrics.one(metrics.xdb_rows_written).inc if metrics is not None else None
    if config.xdb.service_process or attach is not None:
        remote = RemoteXDB(data_dir, config.xdb, attach=attach, on_commit=on_commit,
                           on_restart=metrics.one(metrics.xdb_service_restarts).inc if metrics is not None else None)
        return cast(XDBClient, remote)  # it serves XDB's interface (xdb/interface.py), call for call
    return XDB.open(data_dir, config.xdb, on_commit=on_commit)


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


def live_process_using_port(find: Callable[[int], psutil.Process | None], port: int) -> psutil.Process | None:
    """`find(port)`, or None when the process it found is gone or a zombie (its command line unreadable)."""
    process = find(port)
    try:
        if process is not None:
            process.cmdline()
    except psutil.Error:
        return None
    return process
