"""The errors AHC raises on purpose: each knows how it is answered over HTTP.

Every package raises these (or its own subclasses) for a problem the caller can fix; the server maps
them to OpenAI's error shape in one handler. Anything else that escapes a route is a bug in AHC and is
answered 500, so an internal failure never poses as a client mistake. The client-input classes are
also `ValueError`s (and `NotFound` a `LookupError`), so Python callers and the CLI catch them as such.
"""

from __future__ import annotations

from typing import ClassVar


class AHCError(Exception):
    """Base of every deliberate AHC error: HTTP status, OpenAI error type, the parameter at fault, a code."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from the message and attributes, not by calling __init__ again: subclasses take other
        # arguments, and the error must cross a process boundary (the XDB service) intact.
        return _rebuild, (type(self), self.message, dict(self.__dict__))


def _rebuild(cls: type[AHCError], message: str, state: dict[str, object]) -> AHCError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class InvalidRequest(AHCError, ValueError):
    """The request's content is wrong: 400, naming the parameter."""

    status = 400
    type = "invalid_request_error"


class PermissionDenied(AHCError):
    """The caller's key may not do this (a server-wide action asked by one tenant): 403."""

    status = 403
    type = "permission_error"


class NotFound(AHCError, LookupError):
    """What the request names does not exist (or belongs to someone else): 404."""

    status = 404
    type = "not_found_error"


class Conflict(AHCError, ValueError):
    """The request is valid but clashes with what is stored: 409."""

    status = 409
    type = "conflict_error"


class PayloadTooLarge(InvalidRequest):
    """One of the request's parts is over a configured size limit: 413."""

    status = 413


class Unavailable(AHCError):
    """A part the request needs (the experience database's disk) is not keeping up: 503, retry later."""

    status = 503
    type = "server_error"

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class RateLimited(AHCError):
    """The server has no room for the request now; the client should retry later: 429."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, retry_after_s: int, *, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s
