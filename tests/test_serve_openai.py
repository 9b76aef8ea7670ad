"""The OpenAI routes as vLLM implements them, served by `ahc serve`, through the official client."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.engine

LONG_SYSTEM = " ".join(f"Rule {i}: particles move and collide on a ring of cells." for i in range(60))


def test_models_lists_the_served_model(client: openai.OpenAI, model_name: str) -> None:
    assert [m.id for m in client.models.list().data] == [model_name]


def test_chat_reply_reports_usage_with_cached_tokens(client: openai.OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(model=model_name, max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Hello there"}])
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens > 0
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens is not None


def test_repeated_prefix_is_read_from_the_cache(client: openai.OpenAI, model_name: str) -> None:
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "first question"}]
    first = client.chat.completions.create(model=model_name, messages=messages, max_tokens=4, temperature=0)
    messages[-1]["content"] = "second, different question"
    second = client.chat.completions.create(model=model_name, messages=messages, max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens > 256
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= second.usage.prompt_tokens


def test_streaming_yields_deltas_that_concatenate_to_the_reply(client: openai.OpenAI, model_name: str) -> None:
    kwargs = dict(model=model_name, max_tokens=12, temperature=0, seed=1,
                  messages=[{"role": "user", "content": "Tell me about cells"}])
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2
    assert text == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_return_logprobs(client: openai.OpenAI, model_name: str) -> None:
    out = client.completions.create(model=model_name, prompt="The ring of cells", max_tokens=5,
                                    temperature=0, logprobs=3)
    logprobs = out.choices[0].logprobs
    assert len(logprobs.tokens) == out.usage.completion_tokens == len(logprobs.token_logprobs)
    assert all(lp <= 0.0 for lp in logprobs.token_logprobs)
    assert all(1 <= len(top) <= 3 + 1 for top in logprobs.top_logprobs)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                       "required": ["city"], "additionalProperties": False},
    },
}


def test_tool_call_round_trip_through_the_chat_template(client: openai.OpenAI, model_name: str,
                                                        no_whitespace_bias: dict) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model=model_name, messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="required", max_tokens=64, temperature=0,
                                           logit_bias=no_whitespace_bias, parallel_tool_calls=False)
    calls = first.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] in {"Paris", "Oslo"}
    messages.append({"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]})
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temp_c": 21})})
    second = client.chat.completions.create(model=model_name, messages=messages, tools=[WEATHER_TOOL],
                                            max_tokens=8, temperature=0)
    # The tool turn was rendered into the prompt: it is longer than the first request's prompt.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.choices[0].finish_reason in {"stop", "length", "tool_calls"}
