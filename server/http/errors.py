"""Every error AHC answers, in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`, or on
the Anthropic Messages API (`/v1/messages...`) in Anthropic's `{"type": "error", "error": {"type",
"message"}}`, since each API's clients parse their own.

Three places produce errors and all end up here:
- AHC's own code raises `core.errors.AHCError` subclasses; one exception handler answers them.
- Request bodies and queries are typed: FastAPI's validation errors become 400s naming the parameter.
- vLLM's routes answer `{"error": {...}}` with its exception names as `type` ("BadRequestError"), and
  Starlette answers unknown routes with `{"detail": ...}`; the gateway (server/http/gateway.py) rewrites
  those bodies with `normalise` into OpenAI's vocabulary, since clients written against OpenAI branch on
  `type`.
Inside AHC's own routers (`AHCRoute`), any other exception is a bug and is answered 500, never a 400.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from core.errors import AHCError

log = logging.getLogger("ahc.server")

OPENAI_TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}

ANTHROPIC_TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
ANTHROPIC_PATH = "/v1/messages"

# Where FastAPI says a bad value came from; the parameter's own name is what a client knows.
_LOC_ROOTS = ("body", "query", "path", "header")


def openai_type(status: int) -> str:
    if status >= 500:
        return "server_error"
    return OPENAI_TYPES.get(status, "invalid_request_error")


def error_body(status: int, message: str, type_: str, code: str | int | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param,
                      "code": code if code is not None else status}}


def error_response(status: int, message: str, type_: str | None = None, code: str | int | None = None,
                   param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = error_body(status, message, type_ or openai_type(status), code, param)
    return JSONResponse(body, status_code=status, headers=headers)


async def ahc_error_handler(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, AHCError)
    return error_response(exc.status, exc.message, exc.type, exc.code, exc.param, exc.headers)


async def validation_error_handler(_: Request, exc: Exception) -> Response:
    """A typed body or query that does not validate: 400 naming the first bad parameter."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if not errors:
        return error_response(400, "the request does not validate", param=None)
    first = errors[0]
    param = _param_of(first)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return error_response(400, f"{param}: {message}" if param else message, param=param)


def _param_of(error: dict[str, Any]) -> str | None:
    ctx_error = (error.get("ctx") or {}).get("error")
    named = getattr(ctx_error, "parameter", None)  # vLLM's own validation errors name their field
    if isinstance(named, str):
        return named
    loc = [str(p) for p in error.get("loc", ())]
    root = loc[0] if loc and loc[0] in _LOC_ROOTS else None
    if root is not None:
        loc = loc[1:]
    if error.get("type") == "json_invalid":  # its `loc` holds the character position
        return root
    # pydantic spells union branches and wrappers into `loc` ("function-wrap[...]"): not field names.
    return ".".join(p for p in loc if "[" not in p and "(" not in p) or root


async def internal_error_handler(request: Request, exc: Exception) -> Response:
    cause = exc.__cause__ or exc
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=cause)
    return error_response(500, f"internal server error ({type(cause).__name__})")


def install_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(AHCError, ahc_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(InternalError, internal_error_handler)


class InternalError(Exception):
    """An unexpected exception inside one of AHC's routes, kept apart from vLLM's ValueError handler
    (vLLM answers a bare ValueError with 400, which would dress AHC's bugs up as client mistakes)."""


class AHCRoute(APIRoute):
    """The route class of AHC's routers: deliberate errors pass through, anything else becomes a 500."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (AHCError, HTTPException, RequestValidationError):
                raise
            except Exception as exc:
                raise InternalError(str(exc)) from exc

        return guarded


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    type_ = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": type_, "message": message}}


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def normalise(status: int, body: bytes, anthropic: bool = False) -> bytes:
    """One error body in OpenAI's shape (Anthropic's with `anthropic`); unparseable bodies become the
    message."""
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
    if anthropic:
        return json.dumps(anthropic_error_body(status, message or f"HTTP {status}")).encode()
    return json.dumps(error_body(status, message or f"HTTP {status}", openai_type(status), code, param)).encode()


def error_message(reply: httpx.Response) -> str:
    """What an error reply in this shape (`{"error": {"message"}}`) says, for a client of the server (`ahc mcp`,
    `ahc codex load`); its text's start when it is in no such shape."""
    try:
        return str(reply.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return reply.text[:500]
