"""Agent frameworks as clients of `ahc serve` with the real model (SmolLM2-135M-Instruct, configs/cpu-small.yaml):
the OpenAI Agents SDK, LangChain's `ChatOpenAI` and Pydantic AI, each on its own, unpatched, pointed at the
server's `/v1` with the test key. Each test names its session in `X-Session-ID` the way its framework passes
headers, checks what the framework made of the replies (the tool ran with arguments following its schema, a
structured output validating, streamed tool-call chunks merging into one call), then finds its turns in XDB
under that session: the user's message, and per request the generated tokens concatenating to the reply the
framework got (or the call it parsed). Versions are pinned in the `test` extra."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

from bench.servers import recall
from server.cluster.server_process import ServerProcess

pytestmark = pytest.mark.real_model
T = TypeVar("T")

ASK_WEATHER = "What is the weather like in Paris today?"
ASK_CAPITAL = "What is the capital of France?"
ASK_FACT = "Paris is the capital of France. Give the city and its country."
CALLED: list[str] = []


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city
    """
    CALLED.append(city)
    return f"It is sunny and 21 C in {city}."


class CityFact(BaseModel):
    city: str = Field(description="The city")
    country: str = Field(description="The country the city is in")


def new_session(name: str) -> str:
    """A session id of this run's own (the rows a test finds in XDB are its own, on a server kept between runs)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def session_header(session: str) -> dict[str, str]:
    return {"X-Session-ID": session}


def openai_client(server: ServerProcess, session: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key, timeout=300,
                       default_headers=session_header(session))


def with_client(server: ServerProcess, session: str, use: Callable[[AsyncOpenAI], Awaitable[T]]) -> T:
    """`use(client)` on an event loop of its own, with an `openai` client naming the session, closed after."""
    async def run() -> T:
        async with openai_client(server, session) as client:
            return await use(client)

    return asyncio.run(run())


def recorded(server: ServerProcess, session: str, replies: int, timeout: float = 10) -> dict[str, Any]:
    """The session's XDB rows once `replies` replies are there: `inputs` (the user's messages), `replies`
    (each request's generated tokens concatenated, in order), `tool_calls` (parsed) and `tool_results`."""
    deadline = time.monotonic() + timeout
    while True:
        rows = recall(server, session_id=session)
        texts: dict[str, str] = {}
        for row in rows:
            if row["event_type"] == "output":
                texts[row["request_id"]] = texts.get(row["request_id"], "") + row["content"]
        turns = sum(row["event_type"] == "system" and row["content"].startswith("turn:") for row in rows)
        if (len(texts) >= replies and turns >= replies) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rows and all(row["session_id"] == session for row in rows)
    return {"inputs": [r["content"] for r in rows if r["event_type"] == "input"],
            "replies": list(texts.values()),
            "tool_calls": [json.loads(r["content"]) for r in rows if r["event_type"] == "tool_call"],
            "tool_results": [r["content"] for r in rows if r["event_type"] == "tool_result"]}


# -- OpenAI Agents SDK ---------------------------------------------------------------------------------------

def agents_model(client: AsyncOpenAI, model: str) -> Any:
    from agents import OpenAIChatCompletionsModel, set_tracing_disabled

    set_tracing_disabled(True)  # no trace export to OpenAI's platform
    return OpenAIChatCompletionsModel(model=model, openai_client=client)


def test_agents_sdk_runs_a_function_tool_loop(real_server: ServerProcess, real_model_name: str) -> None:
    from agents import Agent, ModelSettings, Runner, ToolCallItem, ToolCallOutputItem, function_tool

    session = new_session("fw-agents-tool-loop")
    # tool_choice="required" for the first turn (a 135M model needs it); the SDK resets it to auto once the
    # tool has run, so the second turn answers in text.
    def run(client: AsyncOpenAI) -> Awaitable[Any]:
        agent = Agent(name="weather", instructions="Use the get_weather tool, then answer in one sentence.",
                      model=agents_model(client, real_model_name), tools=[function_tool(get_weather)],
                      model_settings=ModelSettings(tool_choice="required", max_tokens=48, temperature=0))
        return Runner.run(agent, ASK_WEATHER, max_turns=4)

    CALLED.clear()
    result = with_client(real_server, session, run)

    calls = [item for item in result.new_items if isinstance(item, ToolCallItem)]
    outputs = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert len(calls) == 1 and calls[0].raw_item.name == "get_weather"
    assert isinstance(json.loads(calls[0].raw_item.arguments)["city"], str)
    assert CALLED == [json.loads(calls[0].raw_item.arguments)["city"]]  # the SDK ran the tool with them
    assert outputs[0].output == f"It is sunny and 21 C in {CALLED[0]}."
    assert isinstance(result.final_output, str) and result.final_output.strip()

    xdb = recorded(real_server, session, replies=2)
    assert xdb["inputs"] == [ASK_WEATHER]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in xdb["tool_calls"]] == \
        [("get_weather", json.loads(calls[0].raw_item.arguments))]
    assert xdb["tool_results"] == [outputs[0].output]
    assert len(xdb["replies"]) == 2 and "<tool_call>" in xdb["replies"][0]
    assert xdb["replies"][1] == result.final_output


def test_agents_sdk_streamed_run(real_server: ServerProcess, real_model_name: str) -> None:
    from agents import Agent, ModelSettings, Runner
    from openai.types.responses import ResponseTextDeltaEvent

    session = new_session("fw-agents-streamed")

    async def run(client: AsyncOpenAI) -> tuple[list[str], Any]:
        agent = Agent(name="geo", instructions="Answer in one short sentence.",
                      model=agents_model(client, real_model_name),
                      model_settings=ModelSettings(max_tokens=32, temperature=0))
        result = Runner.run_streamed(agent, ASK_CAPITAL)
        deltas = [event.data.delta async for event in result.stream_events()
                  if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent)]
        return deltas, result.final_output

    deltas, final = with_client(real_server, session, run)
    assert len(deltas) > 1 and "".join(deltas) == final and "Paris" in final

    xdb = recorded(real_server, session, replies=1)
    assert xdb["inputs"] == [ASK_CAPITAL] and xdb["replies"] == [final]


def test_agents_sdk_default_responses_model_continues_a_stored_response(real_server: ServerProcess,
                                                                        real_model_name: str) -> None:
    """The SDK's own model is the Responses one; a second run continues the first by previous_response_id
    (the response AHC stored): one session, each question recorded once, the first prompt read from cache."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    session, follow_up = new_session("fw-agents-responses"), "And the capital of Italy?"

    async def run(client: AsyncOpenAI) -> tuple[Any, Any]:
        agent = Agent(name="geo", instructions="Answer in one short sentence.",
                      model=OpenAIResponsesModel(model=real_model_name, openai_client=client),
                      model_settings=ModelSettings(max_tokens=24, temperature=0))
        first = await Runner.run(agent, ASK_CAPITAL)
        return first, await Runner.run(agent, follow_up, previous_response_id=first.last_response_id)

    first, second = with_client(real_server, session, run)
    assert first.final_output.strip() and second.final_output.strip()
    xdb = recorded(real_server, session, replies=2)
    assert xdb["inputs"] == [ASK_CAPITAL, follow_up]
    assert xdb["replies"] == [first.final_output, second.final_output]
    records = [r["metadata"]["turn"] for r in recall(real_server, session_id=session, event_types="system")
               if "turn" in (r["metadata"] or {})]
    assert len(records) == 2 and records[1]["cached_tokens"] >= records[0]["prompt_tokens"] - 16, records


# -- LangChain -----------------------------------------------------------------------------------------------

def chat_openai(server: ServerProcess, model: str, session: str, max_tokens: int = 48) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=model, base_url=f"{server.base_url}/v1", api_key=server.api_key,
                      temperature=0, max_tokens=max_tokens, timeout=300, default_headers=session_header(session))


def merged(chunks: list[Any]) -> Any:
    """LangChain's own merge of streamed message chunks (`+`)."""
    assert len(chunks) > 1
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total


def test_langchain_invoke_and_stream(real_server: ServerProcess, real_model_name: str) -> None:
    session = new_session("fw-langchain-text")
    llm = chat_openai(real_server, real_model_name, session, max_tokens=24)
    reply = llm.invoke(ASK_CAPITAL)
    assert "Paris" in reply.content and reply.response_metadata["finish_reason"] == "stop"

    streamed = merged(list(llm.stream(ASK_CAPITAL)))
    assert streamed.content == reply.content and streamed.response_metadata["finish_reason"] == "stop"

    xdb = recorded(real_server, session, replies=2)
    assert xdb["inputs"] == [ASK_CAPITAL] * 2 and xdb["replies"] == [reply.content, streamed.content]


@pytest.mark.parametrize("choice", ["required", "get_weather"], ids=["required", "named"])
def test_langchain_bind_tools_forced_call(real_server: ServerProcess, real_model_name: str, choice: str) -> None:
    session = new_session(f"fw-langchain-tools-{choice}")
    llm = chat_openai(real_server, real_model_name, session).bind_tools([get_weather], tool_choice=choice)
    reply = llm.invoke(ASK_WEATHER)
    assert not reply.invalid_tool_calls
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city"} and isinstance(call["args"]["city"], str)

    xdb = recorded(real_server, session, replies=1)
    assert xdb["inputs"] == [ASK_WEATHER]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in xdb["tool_calls"]] \
        == [(call["id"], "get_weather", call["args"])]


def test_langchain_streamed_tool_call_merges_from_chunks(real_server: ServerProcess, real_model_name: str) -> None:
    session = new_session("fw-langchain-tool-stream")
    llm = chat_openai(real_server, real_model_name, session).bind_tools([get_weather], tool_choice="required")
    chunks = list(llm.stream(ASK_WEATHER))
    assert sum(bool(chunk.tool_call_chunks) for chunk in chunks) > 1  # the call came in pieces
    message = merged(chunks)
    assert not message.invalid_tool_calls
    [call] = message.tool_calls
    [piece] = message.tool_call_chunks
    assert call["name"] == "get_weather" and call["args"] == json.loads(piece["args"])
    assert set(call["args"]) == {"city"} and isinstance(call["args"]["city"], str)
    assert message.response_metadata["finish_reason"] == "tool_calls"

    xdb = recorded(real_server, session, replies=1)
    assert xdb["inputs"] == [ASK_WEATHER]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in xdb["tool_calls"]] \
        == [(call["id"], "get_weather", call["args"])]


def test_langchain_structured_output_json_schema(real_server: ServerProcess, real_model_name: str) -> None:
    session = new_session("fw-langchain-structured")
    llm = chat_openai(real_server, real_model_name, session).with_structured_output(
        CityFact, method="json_schema", include_raw=True)
    result = llm.invoke(ASK_FACT)
    assert result["parsing_error"] is None and isinstance(result["parsed"], CityFact)
    assert CityFact.model_validate_json(result["raw"].content) == result["parsed"]
    assert result["parsed"].city == "Paris"

    xdb = recorded(real_server, session, replies=1)
    assert xdb["inputs"] == [ASK_FACT] and xdb["replies"] == [result["raw"].content]


# -- Pydantic AI ---------------------------------------------------------------------------------------------

def pydantic_ai_model(client: AsyncOpenAI, model: str) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))


def test_pydantic_ai_text_output(real_server: ServerProcess, real_model_name: str) -> None:
    from pydantic_ai import Agent

    session = new_session("fw-pydantic-ai-text")

    def run(client: AsyncOpenAI) -> Awaitable[Any]:
        agent = Agent(pydantic_ai_model(client, real_model_name), instructions="Answer in one short sentence.")
        return agent.run(ASK_CAPITAL, model_settings={"max_tokens": 32, "temperature": 0})

    result = with_client(real_server, session, run)
    assert isinstance(result.output, str) and "Paris" in result.output

    xdb = recorded(real_server, session, replies=1)
    assert xdb["inputs"] == [ASK_CAPITAL] and xdb["replies"] == [result.output]


def test_pydantic_ai_structured_output(real_server: ServerProcess, real_model_name: str) -> None:
    from pydantic_ai import Agent

    session = new_session("fw-pydantic-ai-structured")
    # Pydantic AI's default structured output: a `final_result` tool the model must call (tool_choice required).

    def run(client: AsyncOpenAI) -> Awaitable[Any]:
        agent = Agent(pydantic_ai_model(client, real_model_name), output_type=CityFact)
        return agent.run(ASK_FACT, model_settings={"max_tokens": 48, "temperature": 0})

    result = with_client(real_server, session, run)
    assert isinstance(result.output, CityFact) and result.output.city == "Paris" and result.output.country

    xdb = recorded(real_server, session, replies=1)
    assert xdb["inputs"] == [ASK_FACT]
    [call] = xdb["tool_calls"]
    assert call["function"]["name"] == "final_result"
    assert CityFact.model_validate_json(call["function"]["arguments"]) == result.output
