"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, for every failure."""

from __future__ import annotations

from starlette.responses import JSONResponse


def error_body(status: int, message: str, type_: str, code: str | int | None = None,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param,
                      "code": code if code is not None else status}}


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   code: str | int | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, type_, code, param), status_code=status, headers=headers)
