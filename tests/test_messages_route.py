"""The Anthropic Messages API as AHC's door, on AHC's whole app (fake engine, TestClient, a real XDB),
through the official `anthropic` client: the same turn as a chat request (session, recording, turn
record, tenant salt), the response as the Messages API's, errors in Anthropic's shape."""

from __future__ import annotations

import json

import anthropic
import pytest
from fake_app import ALICE, BOB
from fastapi.testclient import TestClient

from server.messages.protocol import metadata_session
from server.runtime import Runtime
from xdb.owner import EVERY
from xdb.recall.browse import session_turns

CLAUDE_USER = "user_5f1e2d_account__session_0b7c9a52-1111-4e4e-9d9d-123456789abc"
CLAUDE_SESSION = "0b7c9a52-1111-4e4e-9d9d-123456789abc"



def client_for(http: TestClient, key: str = ALICE) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://testserver", api_key=key, http_client=http, max_retries=0)


def turns(runtime: Runtime, session_id: str) -> list[dict]:  # type: ignore[type-arg]
    runtime.xdb.writer.flush()
    return runtime.xdb.read(session_turns, session_id)["turns"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("user_id", "session"), [
    (CLAUDE_USER, CLAUDE_SESSION),
    (json.dumps({"device_id": "d1", "account_uuid": "", "session_id": "s-json"}), "s-json"),
    ("plain-user", None), (None, None)])
def test_the_session_part_of_claude_codes_user_id(user_id: str | None, session: str | None) -> None:
    assert metadata_session({"user_id": user_id} if user_id is not None else None) == session


def test_a_two_turn_exchange_is_one_session_with_its_inputs_and_turn_records(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = client_for(http)  # the SDK authenticates with x-api-key
    history: list[dict] = [{"role": "user", "content": "Which cells move?"}]  # type: ignore[type-arg]
    first = client.messages.with_raw_response.create(
        model="tiny", max_tokens=8, system=[{"type": "text", "text": "x-anthropic-billing-header: cc=1; nonce=7"},
                                            {"type": "text", "text": "You are a physicist."}],
        messages=history, metadata={"user_id": CLAUDE_USER})
    assert first.headers["X-Session-ID"] == CLAUDE_SESSION
    message = first.parse()
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "text"
    report = message.model_extra["context"]  # type: ignore[index]
    assert report["session_id"] == CLAUDE_SESSION

    history += [{"role": "assistant", "content": message.content[0].text},  # type: ignore[union-attr]
                {"role": "user", "content": "And then?"}]
    second = client.messages.create(model="tiny", max_tokens=8, messages=history, metadata={"user_id": CLAUDE_USER},
                                    system="You are a physicist.")
    assert second.usage.cache_read_input_tokens is not None

    runtime.xdb.writer.flush()
    scoped = runtime.keys.tenant_for(ALICE).scope(CLAUDE_SESSION)  # type: ignore[union-attr]
    inputs = runtime.xdb.recall(session_id=scoped, event_types=["input"], owner=EVERY)
    assert [r["content"] for r in inputs if r["role"] == "user"] == ["Which cells move?", "And then?"]
    assert not [r for r in inputs if "billing-header" in (r["content"] or "")]  # vLLM's converter drops it
    records = turns(runtime, scoped)
    assert len(records) == 2 and all(r["prompt_tokens"] > 0 for r in records)
    outputs = runtime.xdb.recall(session_id=scoped, event_types=["output"], owner=EVERY)
    assert len(outputs) == message.usage.output_tokens + second.usage.output_tokens


def test_a_streamed_message_parses_and_carries_the_cache_report(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = client_for(http)
    with client.messages.stream(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Stream it"}],
                                extra_headers={"X-Session-ID": "streamed"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    assert events[0].message.model_extra["context"]["session_id"] == "streamed"  # type: ignore[index]
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0
    text = "".join(b.text for b in final.content if b.type == "text")
    scoped = runtime.keys.tenant_for(ALICE).scope("streamed")  # type: ignore[union-attr]
    records = turns(runtime, scoped)
    assert len(records) == 1
    outputs = runtime.xdb.recall(session_id=scoped, event_types=["output"], owner=EVERY)
    assert "".join(r["content"] for r in outputs) == text


def test_tool_use_and_its_result_are_recorded_as_the_chat_door_records_them(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]},
    ]
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    reply = client_for(http).messages.create(model="tiny", max_tokens=8, messages=messages, tools=tools,  # type: ignore[arg-type]
                                             extra_headers={"X-Session-ID": "tools"})
    assert reply.content
    runtime.xdb.writer.flush()
    scoped = runtime.keys.tenant_for(ALICE).scope("tools")  # type: ignore[union-attr]
    rows = runtime.xdb.recall(session_id=scoped, owner=EVERY)
    assert any(r["event_type"] == "tool_result" and "sunny" in (r["content"] or "") for r in rows), rows


def test_each_tenant_gets_its_own_cache_salt_on_the_messages_door(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    before = len(runtime.hidden.engine.requests)  # type: ignore[attr-defined]
    for key in (ALICE, ALICE, BOB):
        client_for(http, key).messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    alice, alice_again, bob = [r.cache_salt for r in runtime.hidden.engine.requests[before:]]  # type: ignore[attr-defined]
    assert alice == alice_again and alice and bob and alice != bob


def test_a_thinking_request_is_served_without_thinking_and_says_so(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, _ = two_tenants
    raw = client_for(http).messages.with_raw_response.create(
        model="tiny", max_tokens=1100, messages=[{"role": "user", "content": "Think"}],
        thinking={"type": "enabled", "budget_tokens": 1024})
    assert raw.http_response.status_code == 200 and "without thinking" in raw.headers["Warning"]
    assert raw.parse().content


def test_errors_come_in_anthropics_shape(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, _ = two_tenants
    with pytest.raises(anthropic.AuthenticationError) as unauthenticated:
        client_for(http, "wrong-key").messages.create(model="tiny", max_tokens=2, messages=[])
    assert unauthenticated.value.body["type"] == "error"  # type: ignore[index]
    assert unauthenticated.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    bad = http.post("/v1/messages", headers={"x-api-key": ALICE}, json={"model": "tiny", "messages": []})
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in bad.json()["error"]["message"]
    # OpenAI's door keeps OpenAI's shape, and a Bearer key still works
    chat = http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {ALICE}"}, json={"model": "tiny"})
    assert chat.status_code == 400 and set(chat.json()) == {"error"} and "param" in chat.json()["error"]
