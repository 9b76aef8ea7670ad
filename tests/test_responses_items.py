"""Responses input items as clients send them, on AHC's whole app (fake engine, TestClient, a real XDB),
through the official `openai` client: an `item_reference` (the Vercel AI SDK's default provider sends
every earlier output item so) is read from the tenant's stored responses, and the tool calls a client
sends back are recorded with their names, arguments and call ids on every path."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import duckdb
import openai
import pytest
from fake_app import BOB
from fastapi.testclient import TestClient
from test_responses_route import client_for, prompt_of, scoped

from server.runtime import Runtime
from xdb.owner import EVERY
from xdb.responses import response_items
from xdb.schema import APP, MIGRATIONS, migrate
from xdb.session_state import list_sessions

CALL = {"type": "function_call", "call_id": "call_7", "name": "read_file", "arguments": '{"path": "laws.md"}'}
RESULT = {"type": "function_call_output", "call_id": "call_7", "output": "rule 110"}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


def sessions(runtime: Runtime) -> int:
    runtime.xdb.writer.flush()
    return len(runtime.xdb.read(list_sessions, EVERY, 10_000))


def test_an_item_reference_is_the_stored_item_and_continues_its_conversation(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = client_for(http)
    first = client.responses.with_raw_response.create(model="tiny", input=[user("Name a cell rule.")],  # type: ignore[list-item]
                                                      max_output_tokens=6)
    r1 = first.parse()
    message = next(item for item in r1.output if item.type == "message")
    second = client.responses.with_raw_response.create(
        model="tiny", max_output_tokens=6,
        input=[user("Name a cell rule."), {"type": "item_reference", "id": message.id}, user("Another one?")])  # type: ignore[list-item]
    assert second.status_code == 200
    assert r1.output_text in prompt_of(runtime)  # the engine got the stored reply's text in its place
    # the history's reply matched: the same session, inferred from the messages
    assert second.headers["X-Session-ID"] == first.headers["X-Session-ID"]
    assert second.parse().model_extra["context"]["session_naming"] == "inferred"  # type: ignore[index]


def test_an_unknown_or_another_tenants_item_is_a_400_in_openais_shape_and_no_session(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    alice, bob = client_for(http), client_for(http, BOB)
    r1 = alice.responses.create(model="tiny", input="Name a cell rule.", max_output_tokens=4)
    before = sessions(runtime)
    for client, ref in ((alice, "msg_nowhere"), (bob, r1.output[0].id)):
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model="tiny", max_output_tokens=4,
                                    input=[user("Hi"), {"type": "item_reference", "id": ref}, user("And?")])  # type: ignore[list-item]
        error = raised.value.body
        assert isinstance(error, dict) and error["param"] == "input[1].id" and ref in error["message"]
    assert sessions(runtime) == before


def tool_rows(runtime: Runtime, session: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The session's tool calls (parsed, with their metadata) and tool results, once its last turn's record
    is there (the rows reach the writer through the recorder's queue)."""
    deadline = time.monotonic() + 2
    while True:
        runtime.xdb.writer.flush()
        rows = runtime.xdb.recall(session_id=session, owner=EVERY)
        if any(r["event_type"] == "tool_result" for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    calls = [json.loads(r["content"]) | {"meta": r["metadata"]} for r in rows if r["event_type"] == "tool_call"]
    return calls, [r for r in rows if r["event_type"] == "tool_result"]


def assert_call_recorded(runtime: Runtime, session: str) -> None:
    calls, results = tool_rows(runtime, session)
    print("CALLS", session, calls)
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]), c["meta"]["tool_call_id"])
            for c in calls if c["id"] == "call_7"] == [("call_7", "read_file", {"path": "laws.md"}, "call_7")]
    assert [(r["content"], r["metadata"]["tool_call_id"]) for r in results] == [("rule 110", "call_7")]
    empty = [r for r in runtime.xdb.recall(session_id=session, event_types=["input"], owner=EVERY)
             if r["role"] == "assistant" and not r["content"]]
    assert empty == []  # no empty row stands for the call


def test_a_client_sent_function_call_is_recorded_with_its_name_arguments_and_call_id(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    """store: false with the whole input, a stored response's continuation, and a named session."""
    http, runtime = two_tenants
    client = client_for(http)
    full = client.responses.with_raw_response.create(model="tiny", store=False, max_output_tokens=4,
                                                     input=[user("Read the laws."), CALL, RESULT])  # type: ignore[list-item]
    assert_call_recorded(runtime, scoped(runtime, full.headers["X-Session-ID"]))

    r1 = client.responses.create(model="tiny", input="Read the laws.", max_output_tokens=4)
    continued = client.responses.with_raw_response.create(model="tiny", previous_response_id=r1.id,
                                                          max_output_tokens=4, input=[CALL, RESULT])  # type: ignore[list-item]
    assert_call_recorded(runtime, scoped(runtime, continued.headers["X-Session-ID"]))

    client.responses.create(model="tiny", store=False, max_output_tokens=4, prompt_cache_key="named-tools",
                            input=[user("Read the laws.")])
    client.responses.create(model="tiny", store=False, max_output_tokens=4, prompt_cache_key="named-tools",
                            input=[user("Read the laws."), CALL, RESULT])  # type: ignore[list-item]
    assert_call_recorded(runtime, scoped(runtime, "named-tools"))


def test_the_items_of_responses_stored_before_the_index_are_found_after_the_migration(tmp_path: Path) -> None:
    path = tmp_path / "experience.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn, path, MIGRATIONS[:5], "xdb_meta", APP)  # a file from before response_items
    response = {"id": "resp_1", "output": [{"id": "msg_a", "type": "message"}, {"id": "fc_b", "type": "function_call"},
                                           {"type": "no id"}]}
    conn.execute("INSERT INTO stored_responses VALUES ('resp_1', 's1', NULL, false, '[]', ?, now())",
                 [json.dumps(response)])
    migrate(conn, path, MIGRATIONS, "xdb_meta", APP)
    found = response_items(conn.cursor(), ["fc_b", "msg_a", "msg_none"])
    assert sorted((session, item["id"]) for session, item in found) == [("s1", "fc_b"), ("s1", "msg_a")]
