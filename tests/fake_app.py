"""AHC's whole app on the fake engine: what `ahc serve` builds around its engine, minus the socket and
the model run, for tests that drive every AHC layer through FastAPI's TestClient in milliseconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from empty_xdb import empty_xdb
from fake_engine import FakeEngine
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response
from vllm.config import VllmConfig

from core.config import AHCConfig
from server.admission.vram_governor import KVStats
from server.app import build_app
from server.engine_args import build_vllm_namespace
from server.metrics import AHCMetrics
from server.runtime import Runtime, build_runtime
from xdb import XDB

# The keys of the two tenants of the `two_tenants` and `audited` apps (tests/conftest.py).
ALICE, BOB = "alice-key", "bob-key"
CAROL = "carol-audits"  # the auditor of the `audited` app (tests/conftest.py)


async def ahc_app(config: AHCConfig, engine: FakeEngine, xdb: XDB) -> tuple[FastAPI, Runtime]:
    """What `ahc serve` builds around its engine, minus the socket."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.renderers.chat_utils import load_chat_template

    args = build_vllm_namespace(config)
    runtime = build_runtime(config, engine, xdb, AHCMetrics(KVStats()),
                            chat_template=load_chat_template(args.chat_template))
    tasks = await engine.get_supported_tasks()
    app = build_app(runtime, args, tasks, engine.model_config)
    await init_app_state(runtime.engine, app.state, args, tasks)
    app.state.server = SimpleNamespace(should_exit=False)  # where serve_http puts uvicorn's server
    return app, runtime


@contextmanager
def serving(config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path, script: Sequence[int] | None = None,
            **overrides: object) -> Iterator[tuple[TestClient, Runtime]]:
    """`script`: the token ids every reply cycles through (FakeEngine's default: a sentence)."""
    config = config.with_overrides(data_dir=str(tmp_path / "xdb"), **overrides)
    xdb = empty_xdb(tmp_path / "xdb")
    try:
        app, runtime = asyncio.run(ahc_app(config, FakeEngine(vllm_config, script=script), xdb))
    except BaseException:  # a config the app refuses: the XDB it was given is closed, not left open
        xdb.close()
        raise
    try:
        with TestClient(app) as client:
            yield client, runtime
    finally:
        runtime.close()
        xdb.close()


def health_while_posting(client: TestClient, path: str, body: bytes) -> tuple[Response, list[float]]:
    """POST `body` to `path` on a thread while this one asks /health every 10 ms: the response and each
    round's latency less its sleep (a stall while this thread sleeps counts as well)."""
    latencies: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, path, content=body, headers={"content-type": "application/json"})
        last = time.perf_counter()
        while not pending.done():
            assert client.get("/health").status_code == 200
            time.sleep(0.01)
            latencies.append(time.perf_counter() - last - 0.01)
            last = time.perf_counter()
        return pending.result(), latencies


def post_scope(path: str, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> dict[str, object]:
    """The ASGI scope of a JSON POST of `body` to `path`."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        *headers]}


def stream_past_a_slow_disk(config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path, monkeypatch: Any,
                            scope: dict[str, object], body: bytes) -> tuple[list[str], list[str], Runtime]:
    """A streamed response over ASGI while every commit takes 0.3 s, its client staying to the end: the
    body chunks sent before the first commit ended, those after, and the runtime (closed)."""

    async def scenario() -> tuple[list[str], list[str], Runtime]:
        xdb = empty_xdb(tmp_path / "xdb")
        app, runtime = await ahc_app(config.with_overrides(data_dir=str(tmp_path / "xdb")),
                                     FakeEngine(vllm_config), xdb)
        flush, committed = runtime.recorder.aflush, asyncio.Event()

        async def slow_flush(timeout: float = 10.0, session_id: str | None = None) -> None:
            await asyncio.sleep(0.3)  # a disk taking its time
            await flush(timeout, session_id)
            committed.set()

        monkeypatch.setattr(runtime.recorder, "aflush", slow_flush)
        before: list[str] = []
        after: list[str] = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, object]:
            if messages:
                return messages.pop(0)
            await asyncio.Event().wait()  # the client stays to the end
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                (after if committed.is_set() else before).append(bytes(message["body"]).decode())

        await app(scope, receive, send)
        runtime.close()
        xdb.close()
        return before, after, runtime

    return asyncio.run(scenario())
