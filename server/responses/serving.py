"""The Responses API as AHC's door: vLLM's own Responses handler generates (its input items, tools and
events stay what its clients parse), inside the turn a chat request takes. The input items, as the chat
messages vLLM renders them into, prepare the turn (session, cache report, recorded inputs); the turn is
admitted against the KV cache (the VRAM governor's 429), the engine request carries the tenant's cache
salt and its tokens are recorded under the session; the response's output items settle into the
session as the chat door's reply does (tool calls recorded, the turn record, the State's hashes). The
cache report rides in the response as `context` (in `response.created`'s response when streamed).

`store` (the API's default) is AHC's, in XDB (xdb/responses.py), not vLLM's in-memory store: a stored
response is read back by `GET /v1/responses/{id}` and continued by `previous_response_id`, by its own
tenant, across a restart. A continuation is a turn of the session's server-kept State, so it reads the
cache and compaction applies: the first continuation of a conversation seeds the State with the
conversation stored up to it, later ones add only their input; continuing an earlier response than the
session's last forks a new session from the conversation up to it. The engine request then carries the
prepared prompt as its input items; the response echoes what the client sent.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from starlette.responses import JSONResponse, Response
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from ahc.core.errors import InvalidRequest, NotFound
from orchestrator.chat_turn import ChatTurn
from orchestrator.context_spec import ContextSpec
from orchestrator.orchestrator import new_session_id
from orchestrator.turn_request import TurnRequest
from server.admission.turn_admission import Asked, wait_for_recording
from server.chat.serving import ChatService, TurnStream, record_inputs, report_json, session_header, settle
from server.emulation.grammar import refuse_responses_grammar
from server.http.retry_headers import request_retry
from server.http.session_key import HEADER, SessionKey, session_key
from server.responses.protocol import (
    CONVERSATION,
    conversation_id,
    input_items,
    input_messages,
    input_tools,
    instructions_of,
    readable,
    references,
    reply_of,
    text_of,
    with_items,
)
from server.runtime import Runtime
from server.telemetry.chat_telemetry import ChatTelemetry
from server.tenancy.request_context import current_session
from server.tenancy.tenant_xdb import TenantXDB
from server.tenancy.tenants import Tenant
from xdb.responses import StoredResponse

if TYPE_CHECKING:
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses

# What a response echoes of its request, as the client sent it (the engine request may differ).
ECHOED = ("instructions", "previous_response_id", "store")


@dataclass
class _Exchange:
    """One request as the client sent it, and what its turn is."""

    request: ResponsesRequest
    view: TenantXDB
    own: list[dict[str, Any]]            # its input items as chat messages, without the instructions
    previous: StoredResponse | None
    kept: bool                           # served from the session's server-kept State

    def echo(self, response: dict[str, Any]) -> dict[str, Any]:
        response.update({key: getattr(self.request, key) for key in ECHOED})
        return response


class ResponsesService:
    """The work of one Responses request: prepare → admit → generate (vLLM's handler) → settle, and the
    stored responses read back and deleted."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.chat = ChatService(runtime)  # whose admission every door shares

    async def serve(self, request: ResponsesRequest, raw_request: Request, tenant: Tenant,
                    telemetry: ChatTelemetry) -> Response:
        runtime, oc = self.runtime, self.runtime.config.orchestrator
        telemetry.model = request.model
        refuse_responses_grammar(runtime.config.engine.emulate, request)
        request = readable(await self.resolved(request, tenant))
        await wait_for_recording(runtime.recorder, oc.recording_wait_s, oc.retry_after_s)
        handler: OpenAIServingResponses = raw_request.app.state.openai_serving_responses
        exchange, turn_request = await self.prepare(request, raw_request, tenant)
        async with runtime.orchestrator.turn(turn_request) as turn:
            telemetry.turn = turn
            await self.chat.admit(turn, Asked.of(request.max_output_tokens, 1))
            await record_inputs(turn, runtime)
            current_session.set(turn.session_id)
            result = await handler.create_responses(self.engine_request(exchange, turn), raw_request)
            if isinstance(result, ErrorResponse):  # the turn rolls back
                return JSONResponse(result.model_dump(mode="json", by_alias=True), status_code=result.error.code)
            if isinstance(result, ResponsesResponse):
                data = exchange.echo(result.model_dump(mode="json", by_alias=True))
                report = report_json(turn)  # as the turn was prepared (stored without it)
                await self.settle(turn, exchange, data)
                data["context"] = report
                return JSONResponse(data, headers={HEADER: session_header(turn)})
            return TurnStream(self.events(result, turn, exchange), turn.hand_over(), telemetry)

    async def resolved(self, request: ResponsesRequest, tenant: Tenant) -> ResponsesRequest:
        """The request with the items it names by `item_reference` read from the tenant's stored responses."""
        ids = references(request)
        if not ids:
            return request
        found = await asyncio.to_thread(TenantXDB(self.runtime.xdb, tenant).response_items, ids)
        return with_items(request, found)

    async def prepare(self, request: ResponsesRequest, raw_request: Request,
                      tenant: Tenant) -> tuple[_Exchange, TurnRequest]:
        """The turn a request takes: as sent (its session named by the client, or inferred), or, continuing
        a stored response, a turn of that response's session's State (or of a new session's, seeded)."""
        view = TenantXDB(self.runtime.xdb, tenant)
        messages = input_messages(request)
        instructions, own = instructions_of(messages)
        tools = tuple(input_tools(request))
        if request.previous_response_id is None:
            return (_Exchange(request, view, own, None, kept=False),
                    TurnRequest(None, messages, request.max_output_tokens, tools, tenant.prefix,
                                self.label(request, raw_request, tenant)))
        previous = await asyncio.to_thread(view.stored_response, request.previous_response_id)
        if previous is None:
            raise NotFound(f"previous response {request.previous_response_id!r} not found (responses are "
                           "continued only when stored, by the key that made them)")
        session_id = previous.session_id
        state = await self.runtime.orchestrator.sessions.aget(session_id)
        # The session's State holds this conversation when the response was its last and was kept; a
        # session with no State yet takes it seeded; anything else forks.
        continues = previous.latest and previous.kept and bool(state.turns)
        if not continues and not (previous.latest and not previous.kept and not state.turns):
            session_id = tenant.prefix + new_session_id()
        history = [] if continues else await asyncio.to_thread(view.response_conversation, previous)
        spec = ContextSpec().model_copy(update={"session_id": session_id})
        return (_Exchange(request, view, own, previous, kept=True),
                TurnRequest(spec, [*instructions, *history, *own], request.max_output_tokens, tools, tenant.prefix,
                            recorded_turns=len(history), retry=request_retry(raw_request.headers)))

    def label(self, request: ResponsesRequest, raw_request: Request, tenant: Tenant) -> str | None:
        """The (scoped) session the request names: `X-Session-ID`, `prompt_cache_key` (Codex CLI's
        conversation id) or `conversation`."""
        key: SessionKey
        if request.prompt_cache_key is not None:
            key = session_key(None, raw_request.headers.get(HEADER), request.prompt_cache_key)
        else:
            key = session_key(None, raw_request.headers.get(HEADER), conversation_id(request), CONVERSATION)
        return tenant.scope(key.session_id) if key.session_id is not None else None

    def engine_request(self, exchange: _Exchange, turn: ChatTurn) -> ResponsesRequest:
        """What vLLM's handler is given: a kept turn's prepared prompt as its instructions and input items
        (the recording engine puts the tenant's salt on the prompt), under an id the server makes. vLLM
        names the response by the request's `request_id`, which a client may set: stored responses are
        looked up by that id, so a client's choice ("" twice, or another tenant's id) would clash."""
        request = exchange.request
        response_id = f"resp_{uuid.uuid4().hex}"
        if not exchange.kept:  # a copy even so: the handler sets `store` off on what it is given
            return request.model_copy(update={"request_id": response_id})
        system, rest = instructions_of(turn.messages)
        update = {"instructions": "\n\n".join(text_of(m.get("content")) for m in system) or None,
                  "input": input_items(rest), "previous_response_id": None, "request_id": response_id}
        # Validated again, so the items are vLLM's types (its handler tells them apart by class).
        return ResponsesRequest.model_validate({**request.model_dump(mode="python", exclude_unset=True), **update})

    async def settle(self, turn: ChatTurn, exchange: _Exchange, response: dict[str, Any]) -> None:
        reply = reply_of(response.get("output") or [])
        await settle(turn, reply, self.runtime)
        if exchange.request.store:
            previous_id = exchange.previous.id if exchange.previous is not None else None
            await asyncio.to_thread(exchange.view.save_response, response["id"], turn.session_id, previous_id,
                                    exchange.kept, [*exchange.own, reply], response)

    async def events(self, events: AsyncGenerator[Any, None], turn: ChatTurn,
                     exchange: _Exchange) -> AsyncIterator[str]:
        """vLLM's events as it sends them (SSE), their responses echoing the request and the cache report
        added to `response.created`'s; the turn settles before `response.completed` goes out, and closes
        when the stream ends."""
        try:
            async for event in events:
                kind = getattr(event, "type", "unknown")
                if getattr(event, "response", None) is not None:
                    data = event.model_dump(mode="json", by_alias=True)
                    exchange.echo(data["response"])
                    if kind == "response.completed":
                        await self.settle(turn, exchange, data["response"])
                    if kind == "response.created":
                        data["response"]["context"] = report_json(turn)
                    payload = json.dumps(data, ensure_ascii=False)
                else:
                    payload = event.model_dump_json(indent=None, by_alias=True)
                yield f"event: {kind}\ndata: {payload}\n\n"
        finally:
            turn.close()

    async def retrieve(self, response_id: str, tenant: Tenant, stream: bool) -> dict[str, Any]:
        if stream:
            raise InvalidRequest("stream: a stored response is read whole", param="stream")
        found = await asyncio.to_thread(TenantXDB(self.runtime.xdb, tenant).stored_response, response_id)
        if found is None:
            raise NotFound(f"response {response_id!r} not found")
        return found.response

    async def delete(self, response_id: str, tenant: Tenant) -> dict[str, Any]:
        if not await asyncio.to_thread(TenantXDB(self.runtime.xdb, tenant).delete_response, response_id):
            raise NotFound(f"response {response_id!r} not found")
        return {"id": response_id, "object": "response", "deleted": True}
