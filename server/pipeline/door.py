"""What every generating door (chat completions, Messages, Responses) does over HTTP: its route goes
ahead of vLLM's on the same path, and each request runs under its log line and trace span, which a
stream carries to its end."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from server.pipeline.turn_stream import TurnStream
from server.telemetry.request_telemetry import RequestTelemetry


def install_ahead(app: FastAPI, route: APIRoute) -> None:
    """Put `route` ahead of vLLM's on the same path (Starlette matches routes in order). vLLM's is never
    reached; left in the OpenAPI document it would replace ours there, and describe its body, not ours."""
    for shadowed in app.router.routes:
        if isinstance(shadowed, APIRoute) and shadowed.path == route.path and shadowed.methods & route.methods:
            shadowed.include_in_schema = False
    app.router.routes.insert(0, route)


async def traced(raw_request: Request, door: str, serve: Callable[[RequestTelemetry], Awaitable[Response]]) -> Response:
    """`serve` under the request's log line and span (`chat MODEL`), ended here, or by the stream."""
    telemetry = RequestTelemetry(raw_request.headers, door)
    try:
        telemetry.requested(await raw_request.json())  # parsed by FastAPI already; Starlette keeps it
        with telemetry.current():
            response = await serve(telemetry)
    except BaseException as exc:
        telemetry.end(exc)
        raise
    if not isinstance(response, TurnStream):
        telemetry.end()
    return response
