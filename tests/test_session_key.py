"""Which session a request names (context.session_id, X-Session-ID, prompt_cache_key), one piece alone."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequest
from core.limits import ID_MAX_CHARS
from orchestrator.named_sessions import NamedSessions
from server.http.session_key import SessionKey, header_value, session_key


def test_none_named_is_no_session() -> None:
    assert session_key(None, None, None) == SessionKey(None, keeps_state=False)


@pytest.mark.parametrize(("context_id", "header", "cache_key", "expected"), [
    ("s1", None, None, SessionKey("s1", True)),
    (None, "s1", None, SessionKey("s1", False)),
    (None, None, "s1", SessionKey("s1", False)),
    ("s1", "s1", "s1", SessionKey("s1", True)),
    (None, " s1 ", "s1", SessionKey("s1", False)),  # a header's surrounding blanks are not part of it
])
def test_every_place_names_the_session_and_only_context_keeps_state(context_id, header, cache_key, expected) -> None:
    assert session_key(context_id, header, cache_key) == expected


@pytest.mark.parametrize(("context_id", "header", "cache_key", "param"), [
    ("s1", "s2", None, "X-Session-ID"),
    ("s1", None, "s2", "prompt_cache_key"),
    (None, "s1", "s2", "prompt_cache_key"),
    ("s1", "s1", "s2", "prompt_cache_key"),
])
def test_different_sessions_named_are_a_400_naming_the_later_one(context_id, header, cache_key, param) -> None:
    with pytest.raises(InvalidRequest) as exc:
        session_key(context_id, header, cache_key)
    assert exc.value.param == param and exc.value.status == 400
    assert "different sessions" in str(exc.value)


@pytest.mark.parametrize(("header", "cache_key", "param"), [
    ("   ", None, "X-Session-ID"),
    ("x" * (ID_MAX_CHARS + 1), None, "X-Session-ID"),
    (None, "", "prompt_cache_key"),
    (None, 42, "prompt_cache_key"),
    (None, "y" * (ID_MAX_CHARS + 1), "prompt_cache_key"),
])
def test_malformed_keys_are_refused(header, cache_key, param) -> None:
    with pytest.raises(InvalidRequest) as exc:
        session_key(None, header, cache_key)
    assert exc.value.param == param


def test_header_value_is_printable_ascii() -> None:
    assert header_value("agent-7") == "agent-7"
    assert header_value("agent 7") == "agent 7"
    assert header_value("agënt\n7") == "ag%C3%ABnt%0A7"


def test_named_sessions_keep_the_last_hashes_of_the_most_recent() -> None:
    named = NamedSessions(capacity=2)
    assert named.last_hashes(None) is None and named.last_hashes("a") is None
    named.remember("a", {"identity": "1"})
    named.remember("b", {"identity": "2"})
    assert named.last_hashes("a") == {"identity": "1"}  # now the most recent
    named.remember("c", {"identity": "3"})  # drops b, the least recently used
    assert named.last_hashes("b") is None and named.last_hashes("a") == {"identity": "1"}
    named.forget("a")
    assert named.last_hashes("a") is None and named.last_hashes("c") == {"identity": "3"}
