"""The Responses API as AHC's door on the turn pipeline (server/pipeline/turn_pipeline.py): vLLM's own
Responses route generates (its input items, tools and events stay what its clients parse). The input items, as the chat
messages vLLM renders them into, prepare the turn (session, cache report, recorded inputs); the turn is
admitted against the KV cache (the VRAM governor's 429), the engine request carries the tenant's cache
salt and its tokens are recorded under the session; the response's output items settle into the
session as the chat door's reply does (tool calls recorded, the turn record, the State's hashes). The
cache report rides in the response as `context` (in `response.created`'s response when streamed).

`store` (the API's default) is AHC's, in XDB (xdb/responses.py), not vLLM's in-memory store: a stored
response is read back by `GET /v1/responses/{id}` and continued by `previous_response_id`, by its own
tenant, across a restart. A continuation sees exactly the conversation up to the response it continues
(the inputs and replies of its chain), never another turn of the same session. It is a turn of the
session's server-kept State, so it reads the cache and compaction applies, while that State holds just
that conversation: the response's own turn was the State's last (its digest, stored with the response,
is the State's now) and no turn of the session is in flight; the first continuation of a conversation
seeds a State the session does not have yet with the conversation stored up to it. Anything else (a
later turn with `store: false`, a sibling continuation of the same response, in parallel or before)
forks a new session seeded from the stored conversation. The engine request then carries the prepared
prompt as its input items; the response echoes what the client sent.

`DELETE /v1/responses/{id}` removes the stored response only, and says so: the session's recorded
tokens and turns, its State and the audit log stay until `DELETE /v1/context/sessions/{id}`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from starlette.responses import Response
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

from core.errors import InvalidRequest, NotFound
from orchestrator.context_spec import ContextSpec
from orchestrator.orchestrator import new_session_id
from orchestrator.session import Session, SessionLock
from orchestrator.turn import Turn
from orchestrator.turn_request import TurnRequest
from server.admission.turn_admission import Asked
from server.emulation.grammar import refuse_responses_grammar
from server.http.retry_headers import request_retry
from server.http.session_key import HEADER, SessionKey, session_key
from server.pipeline.turn_pipeline import TurnPipeline, report_json
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
from server.telemetry.request_telemetry import RequestTelemetry
from server.tenancy.tenant_xdb import TenantXDB
from server.tenancy.tenants import Tenant
from xdb.responses import StoredResponse, state_digest

# What a response echoes of its request, as the client sent it (the engine request may differ).
ECHOED = ("instructions", "previous_response_id", "store")
# The stream's events that carry the response object: each echoes the request.
RESPONSE_EVENTS = frozenset(("response.created", "response.in_progress", "response.completed",
                             "response.incomplete", "response.failed"))
# How often a continuation waits out the turns in flight on its session before it forks instead.
IDLE_WAITS = 3
# What a deleted response's reply says stays, and where it goes.
KEPT_AFTER_DELETE = ("Only the stored response is removed: the session's recorded tokens and turns, its State "
                     "and the audit log keep what it said; DELETE /v1/context/sessions/{session_id} removes those.")


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


@dataclass
class ResponsesDoorCall:
    """A Responses request on the turn pipeline: its items as the chat messages vLLM renders them into
    (the conversation of a stored response it continues, the items it names by reference), vLLM's
    Responses route on the prepared prompt, the reply from the response's output items, and the
    response stored when `store` asks."""

    request: ResponsesRequest
    raw_request: Request
    tenant: Tenant
    exchange: _Exchange | None = field(default=None, init=False)  # once resolved

    @property
    def model(self) -> str | None:
        return self.request.model

    @property
    def asked(self) -> Asked:
        return Asked.of(self.request.max_output_tokens, 1)

    @property
    def holds_end(self) -> bool:
        return True  # one output item: the stream holds `response.completed`, a JSON body settles before it goes

    def refuse(self, runtime: Runtime) -> None:
        refuse_responses_grammar(runtime.config.engine.emulate, self.request)

    async def resolve(self, runtime: Runtime) -> TurnRequest:
        """The items it names by `item_reference`, read from the tenant's stored responses; then its turn."""
        view = TenantXDB(runtime.xdb, self.tenant)
        request = self.request
        if ids := references(request):
            request = with_items(request, await asyncio.to_thread(view.response_items, ids))
        self.request = readable(request)
        self.exchange, turn_request = await self.prepare(runtime, view)
        return turn_request

    async def prepare(self, runtime: Runtime, view: TenantXDB) -> tuple[_Exchange, TurnRequest]:
        """The turn a request takes: as sent (its session named by the client, or inferred), or, continuing
        a stored response, a turn of that response's session's State (or of a new session's, seeded)."""
        request, raw_request, tenant = self.request, self.raw_request, self.tenant
        messages = input_messages(request)
        instructions, own = instructions_of(messages)
        tools = tuple(input_tools(request))
        if request.previous_response_id is None:
            return (_Exchange(request, view, own, None, kept=False),
                    TurnRequest(None, messages, request.max_output_tokens, tools, tenant.prefix,
                                self.label()))
        previous = await asyncio.to_thread(view.stored_response, request.previous_response_id)
        if previous is None:
            raise NotFound(f"previous response {request.previous_response_id!r} not found (responses are "
                           "continued only when stored, by the key that made them)")
        session_id, history = await self.continued(runtime, view, previous)
        # Nothing awaits from here to the turn taking the session's lock: the State was checked idle.
        spec = ContextSpec().model_copy(update={"session_id": session_id})
        return (_Exchange(request, view, own, previous, kept=True),
                TurnRequest(spec, [*instructions, *history, *own], request.max_output_tokens, tools, tenant.prefix,
                            recorded_messages=len(history), retry=request_retry(raw_request.headers)))

    async def continued(self, runtime: Runtime, view: TenantXDB,
                        previous: StoredResponse) -> tuple[str, list[dict[str, Any]]]:
        """The session a continuation of `previous` is a turn of, and the stored conversation its State is
        seeded with (none when the State holds it). The check is made with no turn of the session in
        flight and returns without awaiting again, so the State it saw is the one the turn takes."""
        sessions = runtime.orchestrator.sessions
        history: list[dict[str, Any]] | None = None
        for _ in range(IDLE_WAITS):
            lock = sessions.lock(previous.session_id)
            if busy(lock):
                async with lock:  # the turns in flight first: the State they leave is the one to check
                    pass
                continue
            state = await sessions.aget(previous.session_id)
            if busy(sessions.lock(previous.session_id)):  # a turn came in meanwhile
                continue
            if previous.kept and state_sha(state) == previous.state_sha:
                return previous.session_id, []
            if history is None:  # read once; the State is checked again after
                history = await asyncio.to_thread(view.response_conversation, previous)
                continue
            return (previous.session_id if not previous.kept and fresh(state) else self.fork()), history
        if history is None:
            history = await asyncio.to_thread(view.response_conversation, previous)
        return self.fork(), history

    def fork(self) -> str:
        return self.tenant.prefix + new_session_id()

    def label(self) -> str | None:
        """The (scoped) session the request names: `X-Session-ID`, `prompt_cache_key` (Codex CLI's
        conversation id) or `conversation`."""
        request, raw_request, tenant = self.request, self.raw_request, self.tenant
        key: SessionKey
        if request.prompt_cache_key is not None:
            key = session_key(None, raw_request.headers.get(HEADER), request.prompt_cache_key)
        else:
            key = session_key(None, raw_request.headers.get(HEADER), conversation_id(request), CONVERSATION)
        return tenant.scope(key.session_id) if key.session_id is not None else None

    def engine_request(self, exchange: _Exchange, turn: Turn) -> ResponsesRequest:
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

    async def generate(self, turn: Turn, raw_request: Request) -> Response | None:
        """vLLM's own Responses route on the engine request (its cancellation when the client hangs up)."""
        from vllm.entrypoints.openai.responses.api_router import create_responses

        assert self.exchange is not None
        response: Response | None = await create_responses(self.engine_request(self.exchange, turn), raw_request)
        return response

    def reply(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return reply_of(body.get("output") or [])

    async def settled(self, turn: Turn, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """The response echoing the request as the client sent it, stored (without the report) if asked."""
        assert self.exchange is not None
        exchange = self.exchange
        exchange.echo(body)
        if exchange.request.store:
            previous_id = exchange.previous.id if exchange.previous is not None else None
            session = turn.prepared.session if exchange.kept else None  # as the turn committed it
            await asyncio.to_thread(exchange.view.save_response, body["id"], turn.session_id, previous_id,
                                    exchange.kept, [*exchange.own, reply], body,
                                    state_sha(session) if session is not None else None)
        return body

    async def stream(self, chunks: AsyncIterable[str | bytes], turn: Turn,
                     pipeline: TurnPipeline) -> AsyncIterator[str | bytes]:
        """vLLM's events as its route sends them, those carrying the response echoing the request and the
        cache report added to `response.created`'s. `response.completed` is held until the reply's rows are
        committed (its last tokens have gone out before it) and the turn has settled; the turn closes when
        the stream ends."""
        assert self.exchange is not None
        sent = 0
        try:
            async for chunk in chunks:
                text = chunk.decode() if isinstance(chunk, bytes) else chunk
                kind = text[7:text.find("\n")] if text.startswith("event: ") else ""
                if kind not in RESPONSE_EVENTS:
                    sent += 1
                    yield chunk  # the usual event: tokens, items, parts; nothing in it names the request
                    continue
                name, _, payload = text.partition("\ndata: ")
                data = json.loads(payload)
                self.exchange.echo(data["response"])
                if kind == "response.created":
                    data["response"]["context"] = report_json(turn)
                if kind == "response.completed":
                    reply = reply_of(data["response"].get("output") or [])
                    if (failure := await pipeline.settle_durably(turn, reply)) is not None:
                        error = {"type": "error", "code": "server_error", "message": failure["error"]["message"],
                                 "param": None, "sequence_number": sent}
                        yield f"event: error\ndata: {json.dumps(error)}\n\n"
                        return
                    await self.settled(turn, data["response"], reply)
                sent += 1
                yield f"{name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
        finally:
            turn.close()


class ResponsesService:
    """A new response through the turn pipeline; the stored responses read back and deleted."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.pipeline = TurnPipeline(runtime)

    async def serve(self, request: ResponsesRequest, raw_request: Request, tenant: Tenant,
                    telemetry: RequestTelemetry) -> Response:
        return await self.pipeline.serve(ResponsesDoorCall(request, raw_request, tenant), raw_request, telemetry)

    async def retrieve(self, response_id: str, tenant: Tenant, stream: bool) -> dict[str, Any]:
        if stream:
            raise InvalidRequest("stream: a stored response is read whole", param="stream")
        found = await asyncio.to_thread(TenantXDB(self.runtime.xdb, tenant).stored_response, response_id)
        if found is None:
            raise NotFound(f"response {response_id!r} not found")
        return found.response

    async def delete(self, response_id: str, tenant: Tenant) -> dict[str, Any]:
        """OpenAI's reply, with the session the response was served in and a `note` of what stays."""
        view = TenantXDB(self.runtime.xdb, tenant)
        found = await asyncio.to_thread(view.stored_response, response_id)
        if found is None or not await asyncio.to_thread(view.delete_response, response_id):
            raise NotFound(f"response {response_id!r} not found")
        session_id = view.shown_id(found.session_id)
        return {"id": response_id, "object": "response", "deleted": True, "session_id": session_id,
                "note": KEPT_AFTER_DELETE.format(session_id=session_id)}


def busy(lock: SessionLock) -> bool:
    """A turn of the session is in flight or waiting (a released lock wakes its next waiter before that
    waiter holds it, so `locked()` alone would miss it)."""
    return lock.locked() or bool(getattr(lock, "_waiters", None))


def state_sha(session: Session) -> str:
    """The digest of the conversation a session's State holds."""
    return state_digest(session.summary, [message.to_message() for message in session.messages])


def fresh(session: Session) -> bool:
    """A session with no State yet."""
    return not session.messages and session.summary is None
