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

A path is checked as the client sent it and forwarded exactly so: one that is not already normal (a dot
segment, an encoded dot, slash or backslash, a backslash, an empty segment) is a 404, since the router or the
HTTP client on the way would resolve it to another path than the one checked (`/v1/../add_worker`).
With keys, a request without one of them is a 401 before its body is read; a body is streamed through,
counted, and refused with 413 past `max_body_bytes` (a declared length over it before a byte is read).

    python -m server.cluster.router_guard --upstream http://router:8000 --port 8000   # keys: AHC_API_KEY
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Iterable

import httpx
import uvicorn
from starlette.types import Message, Receive, Scope, Send

API_PREFIXES = ("/v1/", "/ui/")
PROBES = frozenset({"/health", "/liveness", "/readiness", "/ping", "/version"})  # open without a key
API_PATHS = frozenset({"/ui", *PROBES})
MAX_BODY_BYTES = 32 << 20  # as `ahc serve`'s own limit (max_request_bytes)
# What a normal path never holds: an encoded dot, slash or backslash, a backslash.
_ABNORMAL = re.compile(r"%2e|%2f|%5c|\\", re.IGNORECASE)
# Hop-by-hop headers (RFC 9110 §7.6.1) and the router's CORS grants never pass.
_DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                      "upgrade", "host", "content-length"})


def allowed(path: str) -> bool:
    """Whether the path, exactly as sent, is one of the API's: normal, and under an API prefix."""
    return normal(path) and (path in API_PATHS or path.startswith(API_PREFIXES))


def normal(path: str) -> bool:
    """Absolute, with no dot or empty segment and nothing encoded that a server would decode into one."""
    segments = path.split("/")
    return (path.startswith("/") and not _ABNORMAL.search(path)
            and all(segment not in ("", ".", "..") for segment in segments[1:-1])
            and segments[-1] not in (".", ".."))


class _TooLarge(Exception):
    """The body passed the limit while it was being forwarded."""


class _Upload:
    """A request body as it arrives, counted: past the limit its upload to the router fails (`over` says
    why, whatever error the HTTP client then reports)."""

    def __init__(self, receive: Receive, max_bytes: int) -> None:
        self.receive, self.max_bytes, self.over = receive, max_bytes, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise httpx.ReadError("the client went away")
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                self.over = True
                raise _TooLarge()
            if chunk:
                yield chunk
            if not message.get("more_body"):
                return


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((value for key, value in scope.get("headers", ()) if key.lower() == name), None)


def declared_length(scope: Scope) -> int | None:
    """The body's Content-Length, trusted only without a transfer encoding (which would override it)."""
    length = _header(scope, b"content-length")
    if length is None or _header(scope, b"transfer-encoding") is not None:
        return None
    try:
        return int(length)
    except ValueError:
        return None


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

    def __init__(self, upstream: str, timeout_s: float = 1800.0, *, api_keys: Iterable[str] = (),
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.upstream = upstream.rstrip("/")
        self.api_keys = tuple(k.encode() for k in api_keys if k)
        self.max_body_bytes = max_body_bytes
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0),
                                         limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if raw is not None else scope["path"]
        if scope["method"] == "OPTIONS" or not allowed(path):
            await _error(send, 404, f"{scope['method']} {path[:200]} is not served here")
            return
        if self.api_keys and path not in PROBES and not self._authorized(scope):
            await _error(send, 401, "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)")
            return
        length = declared_length(scope)
        if length is not None and length > self.max_body_bytes:
            await self._too_large(send)
            return
        query = scope.get("query_string", b"")
        url = self.upstream + path + (f"?{query.decode('latin-1')}" if query else "")
        headers = _passed(scope["headers"], keep_length=length is not None)
        upload = _Upload(receive, self.max_body_bytes)
        request = self._client.build_request(scope["method"], url, headers=headers, content=upload)
        try:
            response = await self._client.send(request, stream=True)
        except (_TooLarge, httpx.HTTPError) as exc:
            if upload.over:
                await self._too_large(send)
            else:
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

    async def _too_large(self, send: Send) -> None:
        await _error(send, 413, f"the request body is over the cluster's limit of {self.max_body_bytes:,} bytes")

    def _authorized(self, scope: Scope) -> bool:
        bearer = _header(scope, b"authorization") or b""
        offered = [bearer[7:].strip()] if bearer[:7].lower() == b"bearer " else []
        offered += [k for k in (_header(scope, b"x-api-key"),) if k]
        return any(hmac.compare_digest(o, key) for o in offered for key in self.api_keys)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


_KINDS = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}


async def _error(send: Send, status: int, message: str) -> None:
    kind = _KINDS.get(status, "server_error")
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class GuardServer:
    """The guard on `host:port`, served by uvicorn on a thread of this process (`ahc cluster`'s own)."""

    def __init__(self, upstream: str, host: str, port: int, *, api_keys: Iterable[str] = (),
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        guard = RouterGuard(upstream, api_keys=api_keys, max_body_bytes=max_body_bytes)
        config = uvicorn.Config(guard, host=host, port=port, log_level="warning", lifespan="on", access_log=False)
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


def main() -> None:
    """The guard as a process of its own, in front of a router it does not start (a container's)."""
    parser = argparse.ArgumentParser(description="The guard in front of vLLM's router (server/cluster/router_guard.py)")
    parser.add_argument("--upstream", required=True, help="the router's private URL, e.g. http://router:8000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    args = parser.parse_args()
    keys = [os.environ["AHC_API_KEY"]] if os.environ.get("AHC_API_KEY") else []  # the replicas' key
    guard = RouterGuard(args.upstream, api_keys=keys, max_body_bytes=args.max_body_bytes)
    uvicorn.run(guard, host=args.host, port=args.port, log_level="warning", lifespan="on", access_log=False)


if __name__ == "__main__":
    main()
