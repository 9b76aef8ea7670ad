"""The Messages API on the chat pipeline: a Messages request becomes the chat request vLLM's own Messages
handler would make of it (system blocks joined, Claude Code's per-request billing line dropped, tool_use
and tool_result blocks as tool calls and tool messages), takes the same turn as a chat request (session,
admission, VRAM governor, tenant salt, recording, State), and the chat response is turned back into the
Messages response vLLM's handler would send: the cache report rides in the message as `context`, and the
cached tokens in `usage.cache_read_input_tokens`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

from server.chat.protocol import ChatCall, ChatRequest
from server.chat.serving import ChatDoorCall
from server.messages.protocol import MessagesRequest, metadata_session
from server.pipeline.turn_pipeline import TurnPipeline
from server.telemetry.request_telemetry import RequestTelemetry
from server.tenancy.tenants import Tenant

if TYPE_CHECKING:
    from vllm.entrypoints.anthropic.protocol import AnthropicDisabledThinkingEffort
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

log = logging.getLogger("ahc.messages")

# The header a response carries when the request asked for something the served model cannot do and was
# served without it (RFC 7234's name for such a note).
WARNING_HEADER = "Warning"
THINKING_DROPPED = ("extended thinking was requested but the served model has no reasoning parser: "
                    "served without thinking")


class MessagesService:
    """The work of one Messages request: to a chat call, through the chat pipeline, back."""

    def __init__(self, pipeline: TurnPipeline) -> None:
        self.pipeline = pipeline
        self._warned: set[str] = set()  # models whose dropped thinking has been logged (once each)

    async def serve(self, request: MessagesRequest, raw_request: Request, tenant: Tenant,
                    telemetry: RequestTelemetry) -> Response:
        handler: AnthropicServingMessages = raw_request.app.state.anthropic_serving_messages
        warning = None
        if request.thinking is not None and request.thinking.type == "enabled" and not reasoning(raw_request):
            # Claude Code asks for thinking by default for Claude model names; a 400 would stop it cold.
            request, warning = request.model_copy(update={"thinking": None}), THINKING_DROPPED
            if request.model not in self._warned:  # every request of a Claude Code session asks again
                self._warned.add(request.model)
                log.warning("%s (model %s; said once, and in each response's Warning header)", THINKING_DROPPED,
                            request.model)
        call = await chat_call(handler, request, raw_request, tenant)
        response = await self.pipeline.serve(ChatDoorCall(call), raw_request, telemetry)
        if warning is not None:
            response.headers[WARNING_HEADER] = f'299 ahc "{warning}"'
        return to_messages(response, handler)


def reasoning(raw_request: Request) -> bool:
    """Whether the engine parses reasoning (`--reasoning-parser`): without it vLLM refuses a thinking budget."""
    config = getattr(raw_request.app.state.vllm_config, "reasoning_config", None)
    return bool(config is not None and config.enabled)


async def chat_call(handler: AnthropicServingMessages, request: MessagesRequest, raw_request: Request,
                    tenant: Tenant) -> ChatCall:
    """The chat request vLLM's Messages handler makes of `request`, read as a chat request is."""
    effort: AnthropicDisabledThinkingEffort = "none"
    if request.thinking is not None and request.thinking.type == "disabled":
        effort = await handler._get_disabled_thinking_effort()
    converted = handler.to_chat_completion_request(request, merge_inline_system=handler._merge_inline_system,
                                                   disabled_thinking_effort=effort)
    session = metadata_session(request.metadata)
    chat = ChatRequest.of(converted, context=request.context, prompt_cache_key=session)
    body = converted.model_dump(mode="json", exclude_unset=True)  # the messages as the orchestrator keeps them
    if request.context is not None:
        body["context"] = request.context.model_dump(mode="json", exclude_unset=True)
    return ChatCall.read(chat, body, raw_request.headers, tenant, cache_param="metadata.user_id")


def to_messages(response: Response, handler: AnthropicServingMessages) -> Response:
    """The chat pipeline's response as the Messages API's; an error is left to the error middleware,
    which gives it the Messages API's shape."""
    if isinstance(response, StreamingResponse):
        response.body_iterator = message_events(response.body_iterator, handler)
        return response
    if response.status_code != 200:
        return response
    assert isinstance(response.body, bytes)
    data = json.loads(response.body)
    context = data.pop("context", None)
    message = handler.messages_full_converter(ChatCompletionResponse.model_validate(data)).model_dump(
        exclude_none=True)
    if context is not None:
        message["context"] = context
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
    return JSONResponse(message, headers=headers, background=response.background)  # the reply's delivery


async def message_events(chunks: AsyncIterable[Any], handler: AnthropicServingMessages) -> AsyncIterator[str]:
    """The chat pipeline's SSE chunks as the Messages API's events (vLLM's own converter), the cache
    report put in `message_start`'s message; an error event of the pipeline's (the reply could not be
    recorded) ends the stream as the Messages API's `error` event."""
    held: dict[str, Any] = {}

    async def chat_events() -> AsyncGenerator[str, None]:
        async for chunk in chunks:
            text = chunk.decode() if isinstance(chunk, bytes) else str(chunk)
            for event in text.split("\n\n"):
                if not event.startswith("data: "):
                    continue
                payload = event[6:]
                if payload != "[DONE]" and ('"context"' in payload or '"error"' in payload):
                    data = json.loads(payload)
                    if "error" in data and "choices" not in data:
                        held["error"] = data["error"]
                        return
                    if "context" in data:
                        held["context"] = data.pop("context")
                        payload = json.dumps(data, ensure_ascii=False)
                yield f"data: {payload}\n\n"

    async for event in handler.message_stream_converter(chat_events()):
        if "context" in held and event.startswith("event: message_start\n"):
            name, _, payload = event.partition("\ndata: ")
            data = json.loads(payload)
            data["message"]["context"] = held.pop("context")
            event = f"{name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
        yield event
    if "error" in held:
        error = {"type": "error", "error": {"type": "api_error", "message": held["error"].get("message", "")}}
        yield f"event: error\ndata: {json.dumps(error)}\n\n"
