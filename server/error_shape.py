"""Every 4xx/5xx body in OpenAI's error shape, whoever produced it.

vLLM already answers `{"error": {...}}` for its own routes, but with its exception names as `type`
("BadRequestError", "NotFoundError"), and Starlette answers unknown routes with `{"detail": ...}`.
Clients written against OpenAI branch on `type`, so this middleware rewrites error bodies into
OpenAI's vocabulary. Streaming bodies and successful responses pass through untouched.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import error_body

OPENAI_TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}


def openai_type(status: int) -> str:
    if status >= 500:
        return "server_error"
    return OPENAI_TYPES.get(status, "invalid_request_error")


def normalise(status: int, body: bytes) -> bytes:
    """The OpenAI-shaped version of one error body; unparseable bodies become the message."""
    try:
        payload = json.loads(body) if body else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        payload = body.decode("utf-8", "replace")
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        message, param, code = error.get("message"), error.get("param"), error.get("code")
    elif isinstance(payload, dict) and "detail" in payload:
        message, param, code = payload["detail"], None, None
    else:
        message, param, code = error if isinstance(error, str) else payload, None, None
    if not isinstance(message, str):
        message = json.dumps(message)
    return json.dumps(error_body(status, message or f"HTTP {status}", openai_type(status), code, param)).encode()


class ErrorShapeMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_wrapper(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = normalise(start["status"], b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", [])
                       if k.lower() not in (b"content-length", b"content-type")]
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_wrapper)
