"""Inputs at the edges of what a type holds, sent over AHC's whole app (fake engine, TestClient, a real
XDB): audit times within a day of year 1 or 9999 whose offsets carry them off the calendar, and ids or
session keys holding a lone surrogate (JSON's `"\\ud800"`), which UTF-8, XDB and DuckDB cannot hold.
Each is read or refused in the API's own shape, and the XDB writer goes on recording."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_app import ALICE, CAROL
from fastapi.testclient import TestClient

from server.runtime import Runtime
from xdb import XDB
from xdb.owner import EVERY
from xdb.rows import TimestepRow, TokenBatch

CHAT = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]}
COMPLETION = {"model": "tiny", "max_tokens": 4, "prompt": "Hello"}
RESPONSE = {"model": "tiny", "max_output_tokens": 4, "input": "Hello"}
LONE = "a\ud800"  # sent as the JSON escape "a\\ud800"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def post(client: TestClient, path: str, body: dict[str, Any]) -> Any:
    """`body` as JSON with every non-ASCII character escaped, as clients' JSON libraries send it."""
    return client.post(path, content=json.dumps(body), headers={**auth(ALICE), "Content-Type": "application/json"})


def say(client: TestClient, session: str) -> None:
    response = client.post("/v1/chat/completions", headers=auth(ALICE),
                           json={**CHAT, "context": {"session_id": session}})
    assert response.status_code == 200, response.text


def audit_sessions(client: TestClient, **params: str) -> set[str]:
    response = client.get("/v1/audit/records", headers=auth(CAROL), params={"limit": "1000", **params})
    assert response.status_code == 200, response.text
    return {r["session_id"] for r in response.json()["data"]}


def test_audit_times_at_the_ends_of_the_calendar_are_bounds(audited: tuple[TestClient, Runtime]) -> None:
    client, _ = audited
    say(client, "lab")
    everything = {"alice/lab"}
    for since in ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00", "0001-01-01T00:30:00+14:00"):
        assert audit_sessions(client, since=since) == everything
    for until in ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59.999999-12:00"):
        assert audit_sessions(client, until=until) == everything
    assert audit_sessions(client, since="9999-12-31T23:59:59-01:00") == set()  # after every record
    assert audit_sessions(client, until="0001-01-01T00:00:00+01:00") == set()  # before every record


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "request_id": LONE}, "request_id"),
    ("/v1/completions", {**COMPLETION, "request_id": LONE}, "request_id"),
    ("/v1/completions", {**COMPLETION, "prompt_cache_key": LONE}, "prompt_cache_key"),
    ("/v1/responses", {**RESPONSE, "conversation": LONE}, "conversation"),
    ("/v1/responses", {**RESPONSE, "prompt_cache_key": LONE}, "prompt_cache_key"),
])
def test_an_id_with_a_lone_surrogate_is_a_400_and_the_writer_records_on(
        audited: tuple[TestClient, Runtime], path: str, body: dict[str, Any], param: str) -> None:
    client, _ = audited
    say(client, "before")
    refused = post(client, path, body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and "surrogate" in error["message"] and error["type"] == "invalid_request_error"
    say(client, "after")
    assert {"alice/before", "alice/after"} <= audit_sessions(client)


def test_a_previous_response_id_with_a_lone_surrogate_names_no_response(audited: tuple[TestClient, Runtime]) -> None:
    client, _ = audited
    refused = post(client, "/v1/responses", {**RESPONSE, "previous_response_id": LONE})
    assert refused.status_code == 404, refused.text
    assert "not found" in refused.json()["error"]["message"]
    say(client, "after")
    assert "alice/after" in audit_sessions(client)


def test_a_request_id_utf8_cannot_hold_is_stored_with_a_replacement(tmp_path: Path) -> None:
    """The writer's own check, under the route's: a row whose request id holds a lone surrogate is kept."""
    with XDB.open(tmp_path / "x") as xdb:
        assert xdb.writer is not None
        ticks = xdb.next_ticks("s", 2)
        xdb.writer.submit([TimestepRow("s", ticks[0], "input", "user", "Hello", request_id="chatcmpl-\ud800")])
        xdb.writer.submit(TokenBatch("s", ticks[1:], ["Hi"], token_ids=[1], request_id="cmpl-\udc00-0"))
        xdb.writer.flush(30)
        rows = xdb.recall(session_id="s", owner=EVERY)
        stored = [(r["content"], r["request_id"]) for r in rows]
        assert stored == [("Hello", "chatcmpl-\ufffd"), ("Hi", "cmpl-\ufffd-0")]
