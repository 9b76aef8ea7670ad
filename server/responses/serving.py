"""The Responses API as AHC's door: vLLM's own Responses handler generates (its input items, tools,
events and store stay what its clients parse), inside the turn a chat request takes. The input items,
as the chat messages vLLM renders them into, prepare the turn (session, cache report, recorded inputs);
the turn is admitted against the KV cache (the VRAM governor's 429), the engine request carries the
tenant's cache salt and its tokens are recorded under the session; the response's output items settle
into the session as the chat door's reply does (tool calls recorded, the turn record, the State's
hashes). The cache report rides in the response as `context` (in `response.created`'s response when
streamed).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from starlette.responses import JSONResponse, Response
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from orchestrator.chat_turn import ChatTurn
from orchestrator.turn_request import TurnRequest
from server.admission.turn_admission import Asked, wait_for_recording
from server.chat.serving import ChatService, TurnStream, record_inputs, report_json, session_header, settle
from server.http.session_key import HEADER, SessionKey, session_key
from server.responses.protocol import (
    CONVERSATION,
    ResponseSessions,
    conversation_id,
    input_messages,
    input_tools,
    reply_of,
)
from server.runtime import Runtime
from server.telemetry.chat_telemetry import ChatTelemetry
from server.tenancy.request_context import current_session
from server.tenancy.tenants import Tenant

if TYPE_CHECKING:
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses


class ResponsesService:
    """The work of one Responses request: prepare → admit → generate (vLLM's handler) → settle."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.chat = ChatService(runtime)  # whose admission every door shares
        self.sessions = ResponseSessions(runtime.config.orchestrator.max_sessions)

    async def serve(self, request: ResponsesRequest, raw_request: Request, tenant: Tenant,
                    telemetry: ChatTelemetry) -> Response:
        runtime, oc = self.runtime, self.runtime.config.orchestrator
        telemetry.model = request.model
        await wait_for_recording(runtime.recorder, oc.vram_queue_timeout_s, oc.retry_after_s)
        handler: OpenAIServingResponses = raw_request.app.state.openai_serving_responses
        turn_request = TurnRequest(None, input_messages(request), request.max_output_tokens,
                                   tuple(input_tools(request)), tenant.prefix, self.label(request, raw_request, tenant))
        async with runtime.orchestrator.turn(turn_request) as turn:
            telemetry.turn = turn
            await self.chat.admit(turn, Asked.of(request.max_output_tokens, 1))
            salt = runtime.keys.cache_salt(tenant)
            if salt is not None:  # the tenant's, in place of the client's
                request = request.model_copy(update={"cache_salt": salt})
            await record_inputs(turn, runtime)
            current_session.set(turn.session_id)
            result = await handler.create_responses(request, raw_request)
            if isinstance(result, ErrorResponse):  # the turn rolls back
                return JSONResponse(result.model_dump(mode="json", by_alias=True), status_code=result.error.code)
            if isinstance(result, ResponsesResponse):
                data = result.model_dump(mode="json", by_alias=True)
                data["context"] = report_json(turn)
                await self.settle(turn, result, tenant)
                return JSONResponse(data, headers={HEADER: session_header(turn)})
            return TurnStream(self.events(result, turn, tenant), turn.hand_over(), telemetry)

    def label(self, request: ResponsesRequest, raw_request: Request, tenant: Tenant) -> str | None:
        """The (scoped) session the request names: `X-Session-ID`, `prompt_cache_key` (Codex CLI's
        conversation id) or `conversation`, else the session of the response it continues."""
        key: SessionKey
        if request.prompt_cache_key is not None:
            key = session_key(None, raw_request.headers.get(HEADER), request.prompt_cache_key)
        else:
            key = session_key(None, raw_request.headers.get(HEADER), conversation_id(request), CONVERSATION)
        if key.session_id is not None:
            return tenant.scope(key.session_id)
        return self.sessions.get(tenant.prefix, request.previous_response_id)

    async def settle(self, turn: ChatTurn, response: ResponsesResponse, tenant: Tenant) -> None:
        await settle(turn, reply_of(response.output), self.runtime)
        self.sessions.remember(tenant.prefix, response.id, turn.session_id)

    async def events(self, events: AsyncGenerator[Any, None], turn: ChatTurn, tenant: Tenant) -> AsyncIterator[str]:
        """vLLM's events as it sends them (SSE), the cache report added to `response.created`'s response;
        the turn settles before `response.completed` goes out, and closes when the stream ends."""
        try:
            async for event in events:
                kind = getattr(event, "type", "unknown")
                if kind == "response.created":
                    data = event.model_dump(mode="json", by_alias=True)
                    data["response"]["context"] = report_json(turn)
                    payload = json.dumps(data, ensure_ascii=False)
                else:
                    if kind == "response.completed":
                        await self.settle(turn, event.response, tenant)
                    payload = event.model_dump_json(indent=None, by_alias=True)
                yield f"event: {kind}\ndata: {payload}\n\n"
        finally:
            turn.close()

