"""A guard in front of vLLM's router: clients reach the cluster's API, never the router's own routes.

vllm-router 0.1.17 serves `POST /add_worker?url=…`, `/remove_worker`, `/flush_cache`, `GET
/list_workers`, `/workers`, `/get_loads` on its client port, to anyone, with `Access-Control-Allow-Origin:
*` — its `--api-key` is for the workers, not these. A web page could add a worker of its own (a simple
POST needs no CORS preflight) and receive the prompts and the keys the router forwards. The router has
no option to close them, so `ahc cluster` binds it to a private loopback port and serves this guard on
the cluster's port: it passes only the API's paths (OpenAI's and AHC's `/v1/…`, the browser under
`/ui`, the health probes), streams each request and response through unchanged, and adds no CORS
headers (it drops the router's): a browser page on another origin can neither read a reply nor send
a preflighted request. Everything else is a 404 in OpenAI's error shape.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable

import httpx
import uvicorn
from starlette.types import Message, Receive, Scope, Send

API_PREFIXES = ("/v1/", "/ui/")
API_PATHS = frozenset({"/ui", "/health", "/liveness", "/readiness", "/ping", "/version"})
# Hop-by-hop headers (RFC 9110 §7.6.1) and the router's CORS grants never pass.
_DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                      "upgrade", "host", "content-length"})


def allowed(path: str) -> bool:
    return path in API_PATHS or path.startswith(API_PREFIXES)


def _passed(headers: Iterable[tuple[bytes, bytes]], *, keep_length: bool) -> list[tuple[bytes, bytes]]:
    out = []
    for name, value in headers:
        lower = name.lower()
        if lower.startswith(b"access-control-") or (lower.decode("latin-1") in _DROPPED
                                                    and not (keep_length and lower == b"content-length")):
            continue
        out.append((lower, value))
    return out


class RouterGuard:
    """An ASGI app forwarding the API's paths to `upstream` (the router's private URL)."""

    def __init__(self, upstream: str, timeout_s: float = 1800.0) -> None:
        self.upstream = upstream.rstrip("/")
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0),
                                         limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] == "OPTIONS" or not allowed(path):
            await _error(send, 404, f"{scope['method']} {path} is not served here")
            return
        parts = []  # joined once: a 20 MB body arrives in hundreds of chunks
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(parts)
        query = scope.get("query_string", b"")
        url = self.upstream + scope["raw_path"].decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
        request = self._client.build_request(scope["method"], url, content=body,
                                             headers=_passed(scope["headers"], keep_length=False))
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _error(send, 502, f"the cluster's router did not answer: {type(exc).__name__}")
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": _passed(response.headers.raw, keep_length=True)})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _error(send: Send, status: int, message: str) -> None:
    kind = "not_found_error" if status == 404 else "server_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class GuardServer:
    """The guard on `host:port`, served by uvicorn on a thread of this process (`ahc cluster`'s own)."""

    def __init__(self, upstream: str, host: str, port: int) -> None:
        config = uvicorn.Config(RouterGuard(upstream), host=host, port=port, log_level="warning", lifespan="on",
                                access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="ahc-router-guard", daemon=True)

    def start(self, timeout_s: float = 30.0) -> GuardServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            raise RuntimeError(f"the router's guard did not start on {self._server.config.host}:"
                               f"{self._server.config.port} (a port in use?)")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
