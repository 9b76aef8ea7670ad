"""Every generating door over real HTTP on the real engine (`ahc serve`, tiny model): the `anthropic` SDK on
the Messages API (authenticated with `x-api-key`, named as Claude Code names its session, streamed, with a
tool round) and the `openai` SDK on the Responses API, each a two-turn exchange whose second turn
continues the first: one session in XDB, its inputs as the user typed them, the second turn reading the
first turn's prompt from vLLM's prefix cache, and a turn record for each turn."""

from __future__ import annotations

import time

import anthropic
import pytest

from bench.servers import recall, recall_until

pytestmark = pytest.mark.engine

SYSTEM = "You are a careful physicist who studies a ring of cells and answers briefly. " * 6
CLAUDE_USER = "user_ab12_account__session_5d0c3f7e-2222-4a4a-8b8b-0123456789ab"
CLAUDE_SESSION = "5d0c3f7e-2222-4a4a-8b8b-0123456789ab"


def turn_records(server, session: str, count: int) -> list[dict]:  # type: ignore[no-untyped-def]
    """The session's turn records, once `count` are there (rows are queryable within a second)."""
    deadline = time.monotonic() + 2
    while True:
        rows = recall(server, session_id=session, event_types="system")
        records = [r["metadata"]["turn"] for r in rows if "turn" in (r["metadata"] or {})]
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def test_claude_code_style_messages_are_one_session_and_the_second_turn_is_cached(server, model_name) -> None:  # type: ignore[no-untyped-def]
    client = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0)  # sends x-api-key
    history: list[dict] = [{"role": "user", "content": "What moves first?"}]  # type: ignore[type-arg]
    first = client.messages.create(model=model_name, max_tokens=3, system=SYSTEM, messages=history,
                                   extra_body={"temperature": 0}, metadata={"user_id": CLAUDE_USER})
    history += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": "And after that?"}]
    with client.messages.stream(model=model_name, max_tokens=3, system=SYSTEM, messages=history,  # type: ignore[arg-type]
                                extra_body={"temperature": 0}, metadata={"user_id": CLAUDE_USER}) as stream:
        second = stream.get_final_message()
    assert second.usage.cache_read_input_tokens is not None
    assert second.usage.cache_read_input_tokens >= first.usage.input_tokens - 16  # the first turn's prompt, cached
    inputs = recall_until(server, 2, session_id=CLAUDE_SESSION, event_types="input")
    assert [r["content"] for r in inputs if r["role"] == "user"] == ["What moves first?", "And after that?"]
    records = turn_records(server, CLAUDE_SESSION, 2)
    assert len(records) == 2 and records[1]["cached_tokens"] >= records[0]["prompt_tokens"] - 16
    outputs = recall(server, session_id=CLAUDE_SESSION, event_types="output")
    assert len(outputs) == first.usage.output_tokens + second.usage.output_tokens


def test_a_tool_round_on_the_messages_door_is_recorded(server, model_name) -> None:  # type: ignore[no-untyped-def]
    client = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0)
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]}]
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    reply = client.messages.create(model=model_name, max_tokens=3, messages=messages, tools=tools,  # type: ignore[arg-type]
                                   tool_choice={"type": "auto"}, extra_headers={"X-Session-ID": "msg-tools"})
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    rows = recall_until(server, 2, session_id="msg-tools")
    assert any(r["event_type"] == "tool_result" and r["content"] == "sunny, 21 C" for r in rows)


def test_codex_style_responses_are_one_session_and_the_second_turn_is_cached(server, client, model_name) -> None:  # type: ignore[no-untyped-def]
    items: list[dict] = [{"type": "message", "role": "user",  # type: ignore[type-arg]
                          "content": [{"type": "input_text", "text": "List the files"}]}]
    first = client.responses.create(model=model_name, instructions=SYSTEM, input=items, max_output_tokens=3,
                                    temperature=0, store=False, prompt_cache_key="codex-conv")
    items += [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Open the first"}]}]
    second = client.responses.create(model=model_name, instructions=SYSTEM, input=items, max_output_tokens=3,
                                     temperature=0, store=False, prompt_cache_key="codex-conv")
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16
    inputs = recall_until(server, 2, session_id="codex-conv", event_types="input")
    assert [r["content"] for r in inputs if r["role"] == "user"] == ["List the files", "Open the first"]
    records = turn_records(server, "codex-conv", 2)
    assert len(records) == 2 and all(r["prompt_tokens"] for r in records)
