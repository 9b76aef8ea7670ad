"""The per-chunk cost of AHC's gateway (server/http/gateway.py) on a streamed response: a tiny ASGI app
streams 10,000 chunks, each after one wait on the event loop as a real stream waits on the engine, once
bare and once through the gateway with every check on (key, recording gate, body limit, JSON type).
Pin it to one core: `taskset -c 1 .venv/bin/python scripts/gateway_chunk_cost.py`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.admission.recording_gate import RecordingGate
from server.http.body_limit import BodyLimit
from server.http.gateway import Gateway
from server.tenancy.auth import ApiKeyCheck
from server.tenancy.tenants import TenantKeys

CHUNKS = 10_000
CHUNK = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
# A gated vLLM route with a declared body, as the openai client sends it, under uvicorn's ASGI spec version.
SCOPE: dict[str, Any] = {
    "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": "POST",
    "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
    "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"2"), (b"authorization", b"Bearer k")]}


async def stream(scope: Scope, receive: Receive, send: Send) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(CHUNKS):
            await asyncio.sleep(0)
            yield CHUNK

    await StreamingResponse(chunks(), media_type="text/event-stream")(scope, receive, send)


def gateway(app: ASGIApp) -> ASGIApp:
    recorder: Any = SimpleNamespace(alive=True, queue=SimpleNamespace(over_backlog=False))
    return Gateway(app, auth=ApiKeyCheck(TenantKeys.build(["k"])), recording=RecordingGate(recorder, 1.0, 1),
                   json_bodies=True, body_limit=BodyLimit(1 << 25))


async def seconds(app: ASGIApp) -> float:
    """One request's wall time; the client stays connected until the response is whole."""
    finished = asyncio.Event()
    requests = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> Message:
        if requests:
            return requests.pop()
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    start = time.perf_counter()
    await app(dict(SCOPE), receive, send)
    elapsed = time.perf_counter() - start
    finished.set()
    return elapsed


async def main() -> None:
    bare, gated = float("inf"), float("inf")
    for _ in range(15):  # the best of 15: the least disturbed by the rest of the machine
        bare = min(bare, await seconds(stream))
        gated = min(gated, await seconds(gateway(stream)))
    bare_us, gated_us = bare / CHUNKS * 1e6, gated / CHUNKS * 1e6
    print(f"bare {bare_us:.3f} us/chunk, through the gateway {gated_us:.3f} us/chunk: "
          f"the gateway adds {gated_us - bare_us:.3f} us/chunk")


if __name__ == "__main__":
    asyncio.run(main())
