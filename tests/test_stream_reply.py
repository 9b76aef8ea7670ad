"""The reply rebuilt from streamed chunks, and the text test that lets most chunks go unparsed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from server.chat.stream_reply import ReplyAccumulator


def choice(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


CHUNKS = [
    {"choices": [choice({"role": "assistant", "content": ""})]},
    {"choices": [choice({"content": 'say "finish_reason":"stop" and "tool_calls"'})]},
    {"choices": [choice({"content": "."}, "stop")]},
    {"choices": [choice({"content": "a"}), choice({"content": "b"}, "length", index=1)]},
    {"choices": [choice({"content": "b"}, "length", index=1), choice({"content": "a"}, "stop")]},
    {"choices": [choice({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{"}}]})]},
    {"choices": [choice({}, "tool_calls")]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    {"error": {"message": "boom", "code": 500}},
]


@pytest.mark.parametrize("text", [False, True], ids=["textless", "with-text"])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("dumps", [lambda c: json.dumps(c, separators=(",", ":")), json.dumps,
                                   lambda c: json.dumps(c, indent=1)], ids=["compact", "spaced", "indented"])
def test_a_chunk_taken_unparsed_makes_the_reply_parsing_would(chunk: dict[str, Any], dumps: Any, text: bool) -> None:
    parsed = ReplyAccumulator(text=text)
    parsed.add(chunk)
    taken = ReplyAccumulator(text=text)
    if taken.take(dumps(chunk)):
        assert taken == parsed


def stream(reply: ReplyAccumulator, payloads: list[str]) -> list[str]:
    """The payloads the reply could not take unparsed, each added as the stream does."""
    parsed = [payload for payload in payloads if not reply.take(payload)]
    for payload in parsed:
        reply.add(json.loads(payload))
    return parsed


def test_content_chunks_go_unparsed_and_a_finish_is_read() -> None:
    compact = [json.dumps(c, separators=(",", ":")) for c in CHUNKS]
    reply = ReplyAccumulator(text=False)
    parsed = stream(reply, compact)
    assert compact[0] not in parsed and compact[-2] not in parsed  # vLLM's role chunk and usage chunk
    assert reply.finished and reply.message()["tool_calls"][0]["id"] == "c1"
    kept = ReplyAccumulator()
    parsed = stream(kept, compact)
    assert compact[1] not in parsed  # content alone, its text taken as it stands
    assert compact[0] in parsed and compact[3] in parsed  # a role beside the content; two choices
    whole = ReplyAccumulator()
    for chunk in CHUNKS:
        whole.add(chunk)
    assert kept.message() == whole.message()


def test_a_quoted_delta_or_escapes_in_content_are_read_right() -> None:
    for content in ('a "delta":{"content":"x"} b', 'line\nbreak \u00e9 \"q\"', "naïve 😀"):
        payload = json.dumps({"choices": [choice({"content": content})]}, separators=(",", ":"), ensure_ascii=False)
        reply = ReplyAccumulator()
        if not reply.take(payload):
            reply.add(json.loads(payload))
        assert reply.message()["content"] == content


def test_streamed_reasoning_joins_the_reply_for_the_state() -> None:
    accumulator = ReplyAccumulator()
    for chunk in ({"choices": [choice({"role": "assistant", "reasoning": "Let me "})]},
                  {"choices": [choice({"reasoning": "think."})]},
                  {"choices": [choice({"content": "Four."}, "stop")]}):
        accumulator.add(chunk)
    assert accumulator.message() == {"role": "assistant", "content": "Four.", "reasoning": "Let me think."}
