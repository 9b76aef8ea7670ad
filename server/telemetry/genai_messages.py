"""The conversation as OpenTelemetry's GenAI conventions record it on a span (`gen_ai.input.messages`,
`gen_ai.output.messages`): a JSON list of messages, each a role and its parts, a text part
`{"type": "text", "content": ...}`, a tool call `{"type": "tool_call", "id", "name", "arguments"}`, a
tool's result `{"type": "tool_call_response", "id", "response"}`, the model's thinking
`{"type": "reasoning", "content": ...}`. A part other than text (an image, a file) is recorded by its
type alone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def input_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt's messages (OpenAI chat messages, as the engine was given them)."""
    return json.dumps([genai_message(m) for m in messages], ensure_ascii=False)


def output_messages(texts: Mapping[int, Sequence[str]], finish_reasons: Mapping[int, str]) -> str:
    """What the engine generated for each choice, in choice order, with the reason it stopped where it did."""
    return json.dumps([output_message("".join(texts[index]), finish_reasons.get(index)) for index in sorted(texts)],
                      ensure_ascii=False)


def settled_output(reply: Mapping[str, Any], finish_reason: str | None) -> str:
    """The reply as its door settled it: its text, reasoning and tool calls (parsed) as parts."""
    message = genai_message(reply)
    if finish_reason is not None:
        message["finish_reason"] = finish_reason
    return json.dumps([message], ensure_ascii=False)


def genai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if thought := message.get("reasoning") or message.get("reasoning_content"):
        parts.append({"type": "reasoning", "content": thought})
    if message.get("role") == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"),
                      "response": "".join(p["content"] for p in content_parts(message.get("content"))
                                          if p["type"] == "text")})
    else:
        parts += content_parts(message.get("content"))
    parts += [tool_call_part(call) for call in message.get("tool_calls") or ()]
    return {"role": message.get("role"), "parts": parts}


def output_message(text: str, finish_reason: str | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "parts": [{"type": "text", "content": text}]}
    if finish_reason is not None:  # none when the request ended before its reply did
        message["finish_reason"] = finish_reason
    return message


def content_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content: a string, or OpenAI content parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[dict[str, Any]] = []
    for part in content or ():
        if isinstance(part, Mapping) and part.get("type") == "text":
            parts.append({"type": "text", "content": part.get("text", "")})
        elif isinstance(part, Mapping):
            parts.append({"type": part.get("type", "unknown")})
    return parts


def tool_call_part(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {"type": "tool_call", "id": call.get("id"), "name": function.get("name"),
            "arguments": parsed(function.get("arguments"))}


def parsed(arguments: Any) -> Any:
    """A tool call's arguments as the object they encode; as sent when they are not JSON."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
