"""Requests that carry a body must say `Content-Type: application/json`, or they are answered 415.

A web page on any site can make a browser POST to `http://127.0.0.1:8000` without a CORS preflight as
long as the request is "simple": a `text/plain`, `application/x-www-form-urlencoded` or
`multipart/form-data` body and no custom headers. FastAPI parses a JSON body whatever its declared
type, so without this check such a page could drive a keyless local server (chat, XDB writes, a
run's purge) and never be asked. `application/json` is not a simple type: the browser must ask first,
and the server allows no cross-origin callers unless configured to. The `openai` client and vLLM's
routes send `application/json` (with or without `; charset=...`), so nothing legitimate is refused;
requests without a body (`DELETE /v1/xdb/runs/{id}`) are not concerned. server/http/gateway.py asks.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Scope

from server.http.errors import error_response

BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def unsupported_media_type(scope: Scope, headers: Headers) -> Response | None:
    """The 415 for an HTTP request whose body is not declared JSON; None for any other."""
    if scope["method"] not in BODY_METHODS or not _has_body(headers) or _is_json(headers.get("content-type", "")):
        return None
    return error_response(415, "A request body must be sent as 'Content-Type: application/json'.",
                          "invalid_request_error", "unsupported_media_type", param="Content-Type")


def _has_body(headers: Headers) -> bool:
    # HTTP/1.1 requests frame a body by one of these two headers; with neither there is none.
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")


def _is_json(content_type: str) -> bool:
    media_type = content_type.partition(";")[0].strip().lower()
    return media_type == "application/json"
