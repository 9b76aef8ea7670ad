"""What AHC reads of a Responses request and of the response vLLM makes: the chat messages and tools its
input items stand for (as vLLM's own handler builds them), the session it names, and the reply its
output items make for the session's State and records."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts

# Where a Responses request may name its session, after the X-Session-ID header and prompt_cache_key.
CONVERSATION = "conversation"


def input_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's instructions and input items as chat messages (those of an earlier response it
    continues are vLLM's to add, from its own store)."""
    messages = construct_input_messages(request_instructions=request.instructions, request_input=request.input)
    return [dict(message) for message in messages]


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


class ResponseSessions:
    """The (scoped) session of each recent response, by tenant and response id, so that a request
    continuing it by `previous_response_id` continues its session, and only the same tenant's
    (least recently used dropped)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._sessions: OrderedDict[tuple[str, str], str] = OrderedDict()

    def get(self, tenant_prefix: str, response_id: str | None) -> str | None:
        if response_id is None:
            return None
        session = self._sessions.get((tenant_prefix, response_id))
        if session is not None:
            self._sessions.move_to_end((tenant_prefix, response_id))
        return session

    def remember(self, tenant_prefix: str, response_id: str, session_id: str) -> None:
        key = (tenant_prefix, response_id)
        self._sessions[key] = session_id
        self._sessions.move_to_end(key)
        while len(self._sessions) > self.capacity:
            self._sessions.popitem(last=False)
