"""`BodyLimit`: a request body over `max_request_bytes` is refused with 413 before it is parsed, so one
client cannot make the server buffer (and JSON-decode) an arbitrarily large body.

A declared `Content-Length` (without a transfer encoding) over the limit is refused before a byte of the
body is read; one within it passes untouched. A body without one (chunked) is counted as the app reads
it (`BodyCount`); the read that passes the limit fails, and whatever the app then does about that
failure is replaced by the 413. server/http/gateway.py applies both."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import Message, Receive, Scope

from server.http.errors import error_response


class BodyLimit:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def refusal(self) -> Response:
        response = error_response(413, f"the request body is over the server's limit of {self.max_bytes:,} bytes",
                                  code="request_too_large")
        # The rest of the body is not read: the connection is closed after the answer.
        response.headers["connection"] = "close"
        return response


class _BodyTooLarge(Exception):
    """Raised into the app by `BodyCount.receive` once the body passes the limit."""


class BodyCount:
    """One request's body, counted as the app reads it. Once it has passed the limit (`refused`), the
    app's own answer is muted (`mutes`), so the gateway's 413 can replace it."""

    def __init__(self, receive: Receive, max_bytes: int) -> None:
        self._receive = receive
        self._max_bytes = max_bytes
        self._received = 0
        self._over = False
        self._started = False

    @property
    def refused(self) -> bool:
        """Over the limit before the app started a response: the 413 is still to be sent."""
        return self._over and not self._started

    async def receive(self) -> Message:
        if self._over:  # the app read on after the failure: the client is, as far as it knows, gone
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._max_bytes:
                self._over = True
                raise _BodyTooLarge()
        return message

    def mutes(self, message: Message) -> bool:
        """Whether the app's `message` is dropped: its answer to the failed read (a 400, a 500)."""
        if self.refused:
            return True
        if message["type"] == "http.response.start":
            self._started = True
        return False


def content_length(scope: Scope) -> int | None:
    """The declared length, trusted only without a transfer encoding: beside one, an HTTP server may read
    the body as chunked (h11 does), so it is counted like any body without a length."""
    headers = dict(scope.get("headers", ()))
    if b"transfer-encoding" in headers or b"content-length" not in headers:
        return None
    try:
        return int(headers[b"content-length"])
    except ValueError:
        return None  # the HTTP server refuses a malformed length itself
