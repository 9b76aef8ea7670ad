"""`BodyLimitMiddleware`: a request body over `max_request_bytes` is refused with 413 before it is
parsed, so one client cannot make the server buffer (and JSON-decode) an arbitrarily large body.

A declared `Content-Length` (without a transfer encoding) over the limit is refused before a byte of the
body is read; one within it passes untouched. A body without one (chunked) is counted as the app reads
it; the read that passes the limit fails, and whatever the app then does about that failure is replaced
by the 413."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.errors import error_response


class _BodyTooLarge(Exception):
    """Raised into the app by `receive` once the body passes the limit; the middleware answers 413."""


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            # The HTTP server delivers exactly the declared length, so a body within the limit needs no
            # counting, and the response (every streamed chunk) goes out without a wrapper of ours.
            if declared > self.max_bytes:
                await self._refuse(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        received = 0
        over = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, over
            if over:  # the app read on after the failure: the client is, as far as it knows, gone
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    raise _BodyTooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over and not started:  # the app's answer to the failed read (a 400, a 500): ours replaces it
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not over or started:
                raise
        if over and not started:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, f"the request body is over the server's limit of {self.max_bytes:,} bytes",
                                  code="request_too_large")
        # The rest of the body is not read: the connection is closed after the answer.
        response.headers["connection"] = "close"
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    """The declared length, trusted only without a transfer encoding: beside one, an HTTP server may read
    the body as chunked (h11 does), so it is counted like any body without a length."""
    headers = dict(scope.get("headers", ()))
    if b"transfer-encoding" in headers or b"content-length" not in headers:
        return None
    try:
        return int(headers[b"content-length"])
    except ValueError:
        return None  # the HTTP server refuses a malformed length itself
