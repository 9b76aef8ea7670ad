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


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("dumps", [lambda c: json.dumps(c, separators=(",", ":")), json.dumps,
                                   lambda c: json.dumps(c, indent=1)], ids=["compact", "spaced", "indented"])
def test_a_chunk_left_unparsed_could_not_have_changed_a_textless_reply(chunk: dict[str, Any], dumps: Any) -> None:
    parsed = ReplyAccumulator(text=False)
    parsed.add(chunk)
    if not ReplyAccumulator(text=False).wants(dumps(chunk)):
        assert parsed == ReplyAccumulator(text=False)


def test_content_chunks_go_unparsed_without_text_and_a_finish_is_read() -> None:
    compact = [json.dumps(c, separators=(",", ":")) for c in CHUNKS]
    reply = ReplyAccumulator(text=False)
    wanted = [c for c in compact if reply.wants(c)]
    assert compact[0] not in wanted and compact[-2] not in wanted  # vLLM's role chunk and usage chunk
    for payload in wanted:
        reply.add(json.loads(payload))
    assert reply.finished and reply.message()["tool_calls"][0]["id"] == "c1"
    assert all(ReplyAccumulator().wants(c) for c in compact)  # a State keeps the text: every chunk is read


def test_streamed_reasoning_joins_the_reply_for_the_state() -> None:
    accumulator = ReplyAccumulator()
    for chunk in ({"choices": [choice({"role": "assistant", "reasoning": "Let me "})]},
                  {"choices": [choice({"reasoning": "think."})]},
                  {"choices": [choice({"content": "Four."}, "stop")]}):
        accumulator.add(chunk)
    assert accumulator.message() == {"role": "assistant", "content": "Four.", "reasoning": "Let me think."}
