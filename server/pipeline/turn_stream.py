"""A streamed reply (SSE) that owns its turn until the response is over."""

from __future__ import annotations

from collections.abc import AsyncIterable

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from orchestrator.turn import Turn
from server.http.session_key import HEADER, header_value
from server.telemetry.request_telemetry import RequestTelemetry
from server.tenancy.request_context import current_tenant


class TurnStream(StreamingResponse):
    """A streamed reply owning its turn until the response is over, with the session's header.

    The stream's own iterator settles the turn; closing it here as well covers a client that hangs up
    before the first chunk, when Starlette never starts the iterator and its cleanup would never run.
    `raw_headers`: the response's, where vLLM made one (its content type among them)."""

    def __init__(self, body: AsyncIterable[str | bytes], turn: Turn, telemetry: RequestTelemetry, *,
                 status_code: int = 200, raw_headers: list[tuple[bytes, bytes]] | None = None,
                 background: BackgroundTask | None = None) -> None:
        super().__init__(body, status_code=status_code, background=background, media_type="text/event-stream")
        if raw_headers is not None:
            self.raw_headers = list(raw_headers)
        session = header_value(current_tenant.get().unscope(turn.session_id))
        self.raw_headers.append((HEADER.lower().encode(), session.encode("latin-1")))
        self._turn = turn
        self._telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error: BaseException | None = None
        try:
            # The stream runs after the route has returned: its span is made current again, so the
            # reply's recording and the engine's outputs stay in the request's trace.
            with self._telemetry.current():
                await super().__call__(scope, receive, send)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._turn.close()
            self._telemetry.end(error)

    async def stream_response(self, send: Send) -> None:
        """The stream, then the turn told its reply was delivered: this returns only once the body's last
        message is sent (a client gone before that cancels or fails it), so no wrapper is laid over
        every chunk's `send`."""
        await super().stream_response(send)
        self._turn.delivered()
