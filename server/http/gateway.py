"""`Gateway`: AHC's one ASGI layer in front of vLLM's app, doing in order what every request meets:

1. every response in the shape of its API (server/http/errors.py `normalise`) and, on the emulated engine,
   labelled `X-AHC-Engine: emulated:PROFILE` (so a figure measured through the API cannot travel without
   its label, whatever the client keeps of the body);
2. the API key and the request's tenant (server/tenancy/auth.py), HTTP and WebSocket;
3. XDB's back-pressure on the routes that generate (server/admission/recording_gate.py);
4. the body limit on a declared length (server/http/body_limit.py), then the JSON content type
   (server/http/content_type.py), then the body limit again on a body counted as it is read.

One layer, not one per check, because at GPU rates the API process's CPU per streamed token decides
throughput: each layer was one more frame and one more `send` wrapper per chunk. Here a chunk of a
response that started below 400 meets one flag test; `receive` is wrapped only for a body without a
declared length. The checks of 2 and 3 live in packages above this one, so they come in as `Guard`s.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.body_limit import BodyCount, BodyLimit, content_length
from server.http.content_type import unsupported_media_type
from server.http.errors import install_exception_handlers, is_anthropic, normalise

ENGINE_HEADER = b"x-ahc-engine"  # the emulated engine's label, on every response

Header = tuple[bytes, bytes]


class Guard(Protocol):
    """A check made once, before the app sees the request: None lets it on; an ASGI app (an error
    response, a WebSocket close) answers it instead. It may set the request's context variables."""

    async def __call__(self, scope: Scope, headers: Headers) -> ASGIApp | None: ...


class Gateway:
    def __init__(self, app: ASGIApp, label: str | None = None, auth: Guard | None = None,
                 recording: Guard | None = None, json_bodies: bool = False,
                 body_limit: BodyLimit | None = None) -> None:
        self.app = app
        self.label = None if label is None else (ENGINE_HEADER, label.encode())
        self.auth = auth
        self.recording = recording
        self.json_bodies = json_bodies
        self.body_limit = body_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The app is awaited right here, not through a helper: every frame between the server and the app
        # is resumed again each time the request's task wakes.
        if scope["type"] != "http":
            refusal = await self._websocket_refusal(scope) if scope["type"] == "websocket" else None
            await (self.app if refusal is None else refusal)(scope, receive, send)
            return
        anthropic = is_anthropic(scope["path"].removeprefix(scope.get("root_path", "")))
        declared = content_length(scope)
        refusal = await self._refusal(scope, declared)
        if refusal is not None:
            await refusal(scope, receive, _shaping_send(send, self.label, anthropic))
        elif self.body_limit is None or declared is not None:
            # A declared length is exactly what the HTTP server delivers: nothing to count.
            await self.app(scope, receive, _shaping_send(send, self.label, anthropic))
        else:
            await self._counted(scope, receive, send, self.body_limit, anthropic)

    async def _websocket_refusal(self, scope: Scope) -> ASGIApp | None:
        return None if self.auth is None else await self.auth(scope, Headers(scope=scope))

    async def _refusal(self, scope: Scope, declared: int | None) -> ASGIApp | None:
        headers = Headers(scope=scope)
        for guard in (self.auth, self.recording):
            refusal = None if guard is None else await guard(scope, headers)
            if refusal is not None:
                return refusal
        if self.body_limit is not None and declared is not None and declared > self.body_limit.max_bytes:
            return self.body_limit.refusal()
        return unsupported_media_type(scope, headers) if self.json_bodies else None

    async def _counted(self, scope: Scope, receive: Receive, send: Send, limit: BodyLimit, anthropic: bool) -> None:
        """The app on a body counted as it reads it; the read that passes the limit fails, and whatever the
        app answers to that failure is replaced by the 413."""
        body = BodyCount(receive, limit.max_bytes)
        try:
            await self.app(scope, body.receive, _shaping_send(send, self.label, anthropic, body))
        except Exception:
            if not body.refused:
                raise
        if body.refused:
            await limit.refusal()(scope, receive, _shaping_send(send, self.label, anthropic))


def _shaping_send(send: Send, label: Header | None, anthropic: bool, body: BodyCount | None = None) -> Send:
    """`send` for one response: labelled, an error's body rewritten into the API's shape, and once a
    response below 400 has started, every further message passed on after one flag test."""
    held: Message | None = None  # an error's start, sent once its body is whole and rewritten
    chunks: list[bytes] = []
    passing = False

    def shaped(message: Message) -> Awaitable[None]:
        # Not a coroutine: a streamed chunk costs this call and the test, no frame of ours to resume.
        return send(message) if passing else inspect(message)

    async def inspect(message: Message) -> None:
        nonlocal held, passing
        if body is not None and body.mutes(message):
            return
        if message["type"] == "http.response.start":
            if label is not None:
                message = {**message, "headers": [*message.get("headers", []), label]}
            if message["status"] >= 400:
                held = message
                return
            passing = True
            await send(message)
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        await _send_reshaped(send, held, normalise(held["status"], b"".join(chunks), anthropic))

    return shaped


async def _send_reshaped(send: Send, start: Message, body: bytes) -> None:
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_gateway(app: FastAPI, label: str | None = None, auth: Guard | None = None,
                    recording: Guard | None = None, json_bodies: bool = False,
                    body_limit: BodyLimit | None = None) -> None:
    """AHC's exception handlers on `app`, and the `Gateway` outside every middleware vLLM has, so it
    reshapes and labels their answers too (its arguments: `Gateway`'s)."""
    install_exception_handlers(app)
    gateway = Middleware(Gateway, label=label, auth=auth, recording=recording, json_bodies=json_bodies,
                         body_limit=body_limit)
    # vLLM's app has built its middleware stack once already: put ours outermost and have it rebuilt.
    app.user_middleware.insert(0, gateway)
    app.middleware_stack = None
