"""The Responses API as AHC's door, on AHC's whole app (fake engine, TestClient, a real XDB), through the
official `openai` client: vLLM's handler generates, inside the chat door's turn (session, recording,
turn record, tenant salt, cache report)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from fake_app import ALICE, BOB, serving
from fastapi.testclient import TestClient
from vllm.config import VllmConfig
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.openai.responses.utils import construct_input_messages

from core.config import AHCConfig
from server.responses.protocol import input_items, input_messages, readable, reply_of
from server.runtime import Runtime
from xdb.owner import EVERY
from xdb.recall.browse import session_turns


def client_for(http: TestClient, key: str = ALICE) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0)


def scoped(runtime: Runtime, session: str, key: str = ALICE) -> str:
    return runtime.keys.tenant_for(key).scope(session)  # type: ignore[union-attr]


def test_codex_style_turns_are_one_session_with_inputs_and_turn_records(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    """Codex CLI resends its whole conversation as input items, its conversation id in prompt_cache_key."""
    http, runtime = two_tenants
    client = client_for(http)
    items: list[dict] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files"}]}]  # type: ignore[type-arg]
    first = client.responses.with_raw_response.create(model="tiny", instructions="You are a coding agent.",
                                                      input=items, max_output_tokens=8, store=False,  # type: ignore[arg-type]
                                                      prompt_cache_key="conv-1")
    assert first.headers["X-Session-ID"] == "conv-1"
    response = first.parse()
    assert response.status == "completed" and response.output_text
    assert response.model_extra["context"]["session_id"] == "conv-1"  # type: ignore[index]
    answer = {"type": "output_text", "text": response.output_text}
    items += [{"type": "message", "role": "assistant", "content": [answer]},
              {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"cmd": "ls"}'},
              {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Open it"}]}]
    second = client.responses.create(model="tiny", instructions="You are a coding agent.", input=items,  # type: ignore[arg-type]
                                     max_output_tokens=8, store=False, prompt_cache_key="conv-1")
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens is not None

    runtime.xdb.writer.flush()
    session = scoped(runtime, "conv-1")
    rows = runtime.xdb.recall(session_id=session, owner=EVERY)
    typed = [r["content"] for r in rows if r["event_type"] == "input" and r["role"] == "user"]
    assert typed == ["List files", "Open it"]
    assert any(r["event_type"] == "tool_result" and r["content"] == "README.md" for r in rows)
    turns = runtime.xdb.read(session_turns, session)["turns"]
    assert len(turns) == 2 and all(t["prompt_tokens"] > 0 for t in turns)
    outputs = [r for r in rows if r["event_type"] == "output"]
    assert len(outputs) == response.usage.output_tokens + second.usage.output_tokens  # type: ignore[union-attr]


def test_a_streamed_response_carries_the_report_and_settles_before_completed(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    with client_for(http).responses.stream(model="tiny", input="Stream please", max_output_tokens=8,
                                           extra_headers={"X-Session-ID": "streamed"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[0].response.model_extra["context"]["session_id"] == "streamed"  # type: ignore[index]
    runtime.xdb.writer.flush()
    rows = runtime.xdb.recall(session_id=scoped(runtime, "streamed"), event_types=["output"], owner=EVERY)
    assert "".join(r["content"] for r in rows) == final.output_text
    assert len(runtime.xdb.read(session_turns, scoped(runtime, "streamed"))["turns"]) == 1


def test_a_response_without_a_name_is_a_session_that_later_turns_continue(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, _ = two_tenants
    client = client_for(http)
    first = client.responses.with_raw_response.create(model="tiny", input="Hello", max_output_tokens=6)
    reply = first.parse()
    assert reply.model_extra["context"]["session_naming"] == "new"  # type: ignore[index]
    again = client.responses.with_raw_response.create(
        model="tiny", max_output_tokens=6,
        input=[{"role": "user", "content": "Hello"}, {"role": "assistant", "content": reply.output_text},  # type: ignore[list-item]
               {"role": "user", "content": "More"}])
    assert again.headers["X-Session-ID"] == first.headers["X-Session-ID"]
    assert again.parse().model_extra["context"]["session_naming"] == "inferred"  # type: ignore[index]


def test_each_tenant_gets_its_own_cache_salt_on_the_responses_door(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    before = len(runtime.hidden.engine.requests)  # type: ignore[attr-defined]
    for key in (ALICE, ALICE, BOB):
        client_for(http, key).responses.create(model="tiny", input="Hi", max_output_tokens=2,
                                               extra_body={"cache_salt": "x"})
    alice, alice_again, bob = [r.cache_salt for r in runtime.hidden.engine.requests[before:]]  # type: ignore[attr-defined]
    assert alice == alice_again and alice and bob and alice != bob and "x" not in (alice, bob)


def test_a_refused_request_is_a_400_in_openais_shape_and_no_turn(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    with pytest.raises(openai.BadRequestError) as bad:
        client_for(http).responses.create(model="tiny", input="Hi", max_output_tokens=-1,
                                          extra_headers={"X-Session-ID": "bad"})
    assert bad.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    runtime.xdb.writer.flush()
    rows = runtime.xdb.recall(session_id=scoped(runtime, "bad"), owner=EVERY)
    assert [r["event_type"] for r in rows] == ["input"]  # what was asked is kept; no reply, no turn record


def test_an_earlier_reply_given_back_with_a_refusal_or_no_part_is_read_not_a_500(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    """vLLM reads only an output message's first part's text: a refusal part (no text) or no part at all
    was an AttributeError or IndexError there, a 500; the parts are read as the assistant's words."""
    http, _ = two_tenants
    said = {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
            "content": [{"type": "refusal", "refusal": "I can't."},
                        {"type": "output_text", "text": " Ask again.", "annotations": []}]}
    for earlier in (said, {**said, "content": []}):
        response = client_for(http).responses.create(
            model="tiny", max_output_tokens=3,
            input=[{"role": "user", "content": "Hi"}, earlier, {"role": "user", "content": "Please?"}])  # type: ignore[list-item]
        assert response.usage is not None and response.usage.output_tokens > 0  # generated, not refused
    request = ResponsesRequest(model="tiny", input=[said])  # type: ignore[list-item]
    assert input_messages(readable(request)) == [{"role": "assistant", "content": "I can't. Ask again."}]


def test_output_items_make_the_chat_reply_and_chat_messages_make_input_items_back() -> None:
    output = [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
              {"type": "message", "content": [{"type": "output_text", "text": "Hi"}]},
              {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]
    reply = reply_of(output)
    assert reply == {"role": "assistant", "content": "Hi", "reasoning": "hm",
                     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    messages = [{"role": "user", "content": "Hello"}, reply,
                {"role": "tool", "tool_call_id": "c1", "content": "done"}, {"role": "user", "content": "And?"}]
    request = ResponsesRequest(model="tiny", input=input_items(messages))  # type: ignore[arg-type]
    back = [dict(m) for m in construct_input_messages(request_input=request.input)]
    assert [m["role"] for m in back] == ["user", "assistant", "tool", "user"]
    assert back[1]["content"] == "Hi" and back[1]["reasoning"] == "hm"
    assert [c["function"]["name"] for c in back[1]["tool_calls"]] == ["f"]
    assert back[2]["tool_call_id"] == "c1" and back[2]["content"] == "done"


def prompt_of(runtime: Runtime) -> str:
    """The text of the last prompt the engine was given."""
    engine = runtime.hidden.engine  # type: ignore[attr-defined]
    return str(engine.get_tokenizer().decode(engine.requests[-1].prompt_token_ids))


def test_stored_responses_continue_as_the_sessions_kept_state_per_tenant(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    """store (the default) keeps each response in XDB: previous_response_id continues it as a turn of its
    session's State (seeded once, then added to), an earlier response forks, other keys find nothing,
    and deleting the response or its session removes it."""
    http, runtime = two_tenants
    alice, bob = client_for(http), client_for(http, BOB)
    first = alice.responses.with_raw_response.create(model="tiny", instructions="Be brief.", input="My name is Ada.",
                                                      max_output_tokens=4)
    r1, session = first.parse(), first.headers["X-Session-ID"]
    assert r1.store is True
    second = alice.responses.with_raw_response.create(model="tiny", input="What is my name?",
                                                       previous_response_id=r1.id, max_output_tokens=4)
    r2 = second.parse()
    assert second.headers["X-Session-ID"] == session and r2.previous_response_id == r1.id and r2.store is True
    assert "My name is Ada." in prompt_of(runtime) and "Be brief." not in prompt_of(runtime)  # not carried over
    r3 = alice.responses.create(model="tiny", input="Spell it.", instructions="Be kind.", previous_response_id=r2.id,
                                max_output_tokens=4)
    prompt = prompt_of(runtime)
    assert prompt.count("My name is Ada.") == 1 and "What is my name?" in prompt and "Be kind." in prompt
    state = runtime.orchestrator.sessions.get(scoped(runtime, session)).messages
    assert [m.content for m in state if m.role == "user"] == ["My name is Ada.", "What is my name?", "Spell it."]
    assert r3.model_extra["context"]["session_naming"] == "explicit"  # type: ignore[index]
    runtime.xdb.writer.flush()
    typed = runtime.xdb.recall(session_id=scoped(runtime, session), event_types=["input"], owner=EVERY)
    assert [r["content"] for r in typed if r["role"] == "user"] == ["My name is Ada.", "What is my name?", "Spell it."]

    fork = alice.responses.with_raw_response.create(model="tiny", input="Or else?", previous_response_id=r1.id,
                                                     max_output_tokens=4)
    assert fork.headers["X-Session-ID"] != session and "What is my name?" not in prompt_of(runtime)
    assert alice.responses.retrieve(r2.id).output_text == r2.output_text

    for call in (lambda: bob.responses.retrieve(r1.id),
                 lambda: bob.responses.create(model="tiny", input="Hi", previous_response_id=r1.id),
                 lambda: bob.responses.delete(r1.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    alice.responses.delete(r3.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(r3.id)
    deleted = http.delete(f"/v1/context/sessions/{session}", headers={"Authorization": f"Bearer {ALICE}"})
    assert deleted.status_code == 200, deleted.text
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(r2.id)
    assert alice.responses.retrieve(fork.parse().id).previous_response_id == r1.id  # the fork's own session stays


def test_a_stored_response_is_continued_after_a_restart(config: AHCConfig, vllm_config: VllmConfig,
                                                        tmp_path: Path) -> None:
    with serving(config, vllm_config, tmp_path) as (http, _):
        r1 = client_for(http).responses.create(model="tiny", input="Remember 42.", max_output_tokens=4)
        assert r1.store is True
    with serving(config, vllm_config, tmp_path) as (http, runtime):
        client = client_for(http)
        assert client.responses.retrieve(r1.id).output_text == r1.output_text
        client.responses.create(model="tiny", input="Which number?", previous_response_id=r1.id, max_output_tokens=4)
        assert "Remember 42." in prompt_of(runtime)


def test_the_server_names_each_stored_response_whatever_request_id_a_client_sends(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    """vLLM names a response by its request's `request_id`, which a client may set: "" twice was a 500
    (a duplicate key in the stored responses), and another tenant's response id would clash with it."""
    http, _ = two_tenants
    alice, bob = client_for(http), client_for(http, BOB)
    kept = alice.responses.create(model="tiny", input="Hello", max_output_tokens=4)
    ids = [bob.responses.create(model="tiny", input="Hi", max_output_tokens=4,
                                extra_body={"request_id": chosen}).id for chosen in ("", "", kept.id)]
    assert len({kept.id, *ids}) == 4 and all(i.startswith("resp_") for i in ids)
    assert alice.responses.retrieve(kept.id).output_text == kept.output_text  # Alice's stays hers
    assert [bob.responses.retrieve(i).id for i in ids] == ids
