"""Which session a request belongs to, named the ways the ecosystem names one.

In order of precedence:
    1. `context.session_id` (body): the server keeps the session's State; the client sends only what is new.
    2. `X-Session-ID` (header): what routers hash for affinity (vLLM's router `consistent_hash`, most
       proxies); names the session for routing and recording only.
    3. `prompt_cache_key` (body, OpenAI's field), or on the Messages API the session part of
       `metadata.user_id` (Claude Code's): the same, for clients that set it.
A header or `prompt_cache_key` changes nothing in what the client sends: an ordinary client resends its
history each turn, and the server records the turn under that session (XDB rows, metrics, the
experience browser) and reports where its prefix changed since the session's last request. Several given
must name the same session; different values are a 400 naming the second. The response carries the
session's id in `X-Session-ID` (percent-encoded where it is not printable ASCII), a generated one too.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from core.errors import InvalidRequest
from core.limits import ID_MAX_CHARS

HEADER = "X-Session-ID"


@dataclass(frozen=True)
class SessionKey:
    session_id: str | None  # as the client named it (not scoped to its tenant)
    keeps_state: bool  # named by `context.session_id`: the server keeps the State


def session_key(context_id: str | None, header: str | None, cache_key: object = None,
                cache_param: str = "prompt_cache_key") -> SessionKey:
    """The request's session from the three places a client may name it (`cache_key` as parsed from the
    body, from `cache_param`: `prompt_cache_key`, or the session part of an Anthropic `metadata.user_id`;
    anything but a string of 1 to ID_MAX_CHARS characters is refused)."""
    if header is not None:
        header = header.strip()
        if not header or len(header) > ID_MAX_CHARS:
            raise InvalidRequest(f"the {HEADER} header must hold 1 to {ID_MAX_CHARS} characters", param=HEADER)
    if cache_key is not None and (not isinstance(cache_key, str) or not 0 < len(cache_key) <= ID_MAX_CHARS):
        raise InvalidRequest(f"{cache_param} must be a string of 1 to {ID_MAX_CHARS} characters",
                             param=cache_param)
    if cache_key is not None and (at := lone_surrogate(cache_key)) is not None:
        raise InvalidRequest(f"{cache_param}: {not_unicode(at)}", param=cache_param)
    named = [(param, value) for param, value in (("context.session_id", context_id), (HEADER, header),
                                                 (cache_param, cache_key)) if value is not None]
    for param, value in named[1:]:
        first_param, first = named[0]
        if value != first:
            raise InvalidRequest(f"{param} {value!r} and {first_param} {first!r} name different sessions: "
                                 "send one of them, or the same id in each", param=param)
    if not named:
        return SessionKey(None, False)
    return SessionKey(named[0][1], keeps_state=context_id is not None)


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds half of a UTF-16 surrogate pair (JSON's `"\\ud800"` escape, or an emoji cut in
    two), which UTF-8 cannot hold, nor therefore XDB's id columns or DuckDB's parameters; None if nowhere."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def not_unicode(at: int) -> str:
    return f"not valid Unicode text (a lone surrogate at character {at})"


def unicode_id(value: str | None) -> str | None:
    """A request model's check of an id the server stores or looks up (pydantic answers its 400)."""
    if value is not None and (at := lone_surrogate(value)) is not None:
        raise ValueError(not_unicode(at))
    return value


def header_value(session_id: str) -> str:
    """The id as an HTTP header value can carry it."""
    if session_id.isascii() and session_id.isprintable():
        return session_id
    return quote(session_id, safe="")
