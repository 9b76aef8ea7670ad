"""What AHC reads of a Responses request and of the response vLLM makes: the chat messages and tools its
input items stand for (as vLLM's own handler builds them), the session it names, and the reply its
output items make for the session's State and records; and back, a prepared prompt's chat messages as
the input items vLLM renders into the same messages."""

from __future__ import annotations

from typing import Any

from openai.types.responses import ResponseOutputMessage, ResponseOutputText
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts

from core.errors import InvalidRequest

# Where a Responses request may name its session, after the X-Session-ID header and prompt_cache_key.
CONVERSATION = "conversation"


INSTRUCTIONS = ("system", "developer")


def input_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's instructions and input items as chat messages (not those of an earlier response it
    continues: the server keeps them)."""
    messages = construct_input_messages(request_instructions=request.instructions, request_input=request.input)
    return [dict(message) for message in messages]


def reference_id(item: Any) -> str | None:
    """The id an input item names when it is an `item_reference` (its type may be left out), else None."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        return None
    if item.get("type") == "item_reference" or (item.keys() == {"id"}):
        return str(item["id"])
    return None


def references(request: ResponsesRequest) -> list[str]:
    """The ids of the items the request names instead of sending them, in order."""
    if isinstance(request.input, str):
        return []
    return [ref for item in request.input if (ref := reference_id(item)) is not None]


def with_items(request: ResponsesRequest, found: dict[str, dict[str, Any]]) -> ResponsesRequest:
    """The request with each `item_reference` replaced by the stored item it names; a 400 naming the
    first it does not find."""
    assert not isinstance(request.input, str)
    items: list[Any] = []
    for index, item in enumerate(request.input):
        ref = reference_id(item)
        if ref is not None:
            if ref not in found:
                raise InvalidRequest(f"input[{index}]: item {ref!r} not found (an item_reference names an output "
                                     "item of a response stored with this key)", param=f"input[{index}].id")
            items.append(found[ref])
        else:
            items.append(item)
    data = request.model_dump(mode="python", exclude_unset=True)
    data["input"] = items
    return ResponsesRequest.model_validate(data)


def readable(request: ResponsesRequest) -> ResponsesRequest:
    """The request with each earlier assistant message it gives back as input read as one text part:
    vLLM reads only an output message's first part's text, which a refusal part has none of and an empty
    message has no first part of (a 500 in its handler). A refusal reads as what the assistant said."""
    if isinstance(request.input, str) or not any(isinstance(i, ResponseOutputMessage) for i in request.input):
        return request
    return request.model_copy(update={"input": [_one_text_part(item) for item in request.input]})


def _one_text_part(item: Any) -> Any:
    if not isinstance(item, ResponseOutputMessage):
        return item
    text = "".join(getattr(part, "text", None) or getattr(part, "refusal", None) or "" for part in item.content)
    return item.model_copy(update={"content": [ResponseOutputText(type="output_text", text=text, annotations=[])]})


def instructions_of(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the system and developer messages, the rest)."""
    return ([m for m in messages if m.get("role") in INSTRUCTIONS],
            [m for m in messages if m.get("role") not in INSTRUCTIONS])


def input_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (a prepared prompt's, without its system message) as Responses input items, which
    vLLM's handler turns back into the same messages: an assistant turn's reasoning, text and tool calls
    as a reasoning item, a message and function_call items; a tool's result as function_call_output."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id") or "",
                          "output": text_of(content)})
        elif role == "assistant":
            if message.get("reasoning"):
                items.append({"type": "reasoning", "id": f"rs_{len(items)}", "summary": [],
                              "content": [{"type": "reasoning_text", "text": str(message["reasoning"])}]})
            if content:
                items.append({"role": "assistant", "content": text_of(content)})
            items += [{"type": "function_call", "call_id": call.get("id") or "", "name": call["function"]["name"],
                       "arguments": call["function"].get("arguments") or ""}
                      for call in message.get("tool_calls") or ()]
        else:
            items.append({"role": role, "content": text_of(content)})
    return items


def text_of(content: Any) -> str:
    """A message's content as text (the text parts of a list of parts, joined)."""
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def input_tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    return construct_tool_dicts(request.tools, request.tool_choice) or []


def conversation_id(request: ResponsesRequest) -> str | None:
    """The Responses `conversation` (an id, or an object with one), kept by vLLM as an extra field."""
    conversation = (request.model_extra or {}).get(CONVERSATION)
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    return conversation if isinstance(conversation, str) and conversation else None


def reply_of(output: list[Any]) -> dict[str, Any]:
    """A response's output items as the assistant message the chat door would have got: its text, its
    function calls (custom tools' too) and its reasoning."""
    texts, reasoning, calls = [], [], []
    for item in output:
        data = item if isinstance(item, dict) else item.model_dump(mode="json")
        kind = data.get("type")
        if kind == "message":
            texts += [part.get("text") or "" for part in data.get("content") or () if "text" in part]
        elif kind == "reasoning":
            reasoning += [part.get("text") or "" for part in data.get("content") or data.get("summary") or ()]
        elif kind in ("function_call", "custom_tool_call"):
            arguments = data.get("arguments") if kind == "function_call" else data.get("input")
            calls.append({"id": data.get("call_id"), "type": "function",
                          "function": {"name": data.get("name"), "arguments": arguments or ""}})
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        reply["tool_calls"] = calls
    if reasoning:
        reply["reasoning"] = "".join(reasoning)
    return reply
