"""`POST /v1/chat/completions` with the orchestrator in front of vLLM's own handler.

The route validates the request (vLLM's `ChatCompletionRequest` plus AHC's `context`), lets the
orchestrator rewrite its messages from `context` (or leaves them as sent) inside a `ChatTurn`, admits
it against the KV cache, then hands a normal request to vLLM's chat handler. vLLM's response comes
back unchanged except for the cache report (`context`), which goes into the JSON body or the first
streamed chunk. The turn commits when the reply completes and rolls back otherwise.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import Field, ValidationError, field_validator
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from ahc.limits import ID_MAX_CHARS, MESSAGE_MAX_CHARS
from orchestrator.chat_turn import ChatTurn
from orchestrator.context_spec import ContextSpec
from server.admission.turn import admit, requested_completion_tokens, wait_for_recording
from server.admission.vram_governor import GovernorRejected
from server.chat_telemetry import ChatTelemetry
from server.errors import error_response
from server.request_context import current_session, current_tenant, current_usage
from server.runtime import Runtime
from server.session_key import HEADER, header_value, session_key
from server.stream_reply import ReplyAccumulator


class ChatRequest(ChatCompletionRequest):
    """vLLM's chat request with AHC's `context` (sent by the `openai` client in `extra_body`)."""

    context: ContextSpec | None = None
    # OpenAI's key for requests that share a prefix: here it names the session (server/session_key.py).
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)

    @field_validator("messages")
    @classmethod
    def _message_sizes(cls, messages: list[Any]) -> list[Any]:
        """Each message's text within MESSAGE_MAX_CHARS (ahc/limits.py): a message may be a pasted
        document, but not the whole body's worth of one."""
        for i, message in enumerate(messages):
            chars = _content_chars(message.get("content") if isinstance(message, dict) else None)
            if chars > MESSAGE_MAX_CHARS:
                raise ValueError(f"messages.{i}.content is {chars:,} characters, over the limit of "
                                 f"{MESSAGE_MAX_CHARS:,}")
        return messages


def _content_chars(content: Any) -> int:
    """A message content's characters: a string, or the text of its parts."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part.get("text") or "") for part in content
                   if isinstance(part, dict) and isinstance(part.get("text"), str))
    return 0


def install_chat_route(app: FastAPI, runtime: Runtime) -> None:
    """Put our route ahead of vLLM's on the same path (Starlette matches routes in order)."""

    async def chat_completions(request: ChatRequest, raw_request: Request) -> Response:
        return await handle_chat(request, raw_request, runtime)

    route = APIRoute("/v1/chat/completions", chat_completions, methods=["POST"], name="ahc_chat_completions",
                     response_model=None)
    for shadowed in app.router.routes:
        # vLLM's route is never reached; left in the OpenAPI document it would replace ours there, and the
        # document would describe a body without `context`.
        if isinstance(shadowed, APIRoute) and shadowed.path == route.path and "POST" in shadowed.methods:
            shadowed.include_in_schema = False
    app.router.routes.insert(0, route)


async def handle_chat(request: ChatRequest, raw_request: Request, runtime: Runtime) -> Response:
    """The request under its log line and trace span, which a streamed response carries to its end."""
    telemetry = ChatTelemetry(raw_request.headers)
    try:
        with telemetry.current():
            response = await serve_turn(request, raw_request, runtime, telemetry)
    except BaseException as exc:
        telemetry.end(exc)
        raise
    if not isinstance(response, TurnStream):
        telemetry.end()
    return response


async def serve_turn(request: ChatRequest, raw_request: Request, runtime: Runtime,
                     telemetry: ChatTelemetry) -> Response:
    from vllm.entrypoints.openai.chat_completion.api_router import create_chat_completion

    body = await raw_request.json()  # already parsed once by FastAPI; Starlette keeps it
    oc = runtime.config.orchestrator
    await wait_for_recording(runtime.recorder, oc.vram_queue_timeout_s, oc.retry_after_s)
    tenant = current_tenant.get()
    key = session_key(request.context.session_id if request.context else None, raw_request.headers.get(HEADER),
                      request.prompt_cache_key)
    label = tenant.scope(key.session_id) if key.session_id is not None and not key.keeps_state else None
    spec = request.context
    if spec is not None and spec.session_id is not None:  # the tenant's own session of that name
        spec = spec.model_copy(update={"session_id": tenant.scope(spec.session_id)})
    if spec is not None:  # documents named by reference read from XDB, with their stored renditions
        spec = await runtime.codex.resolve(spec, tenant.owner)
    # The orchestrator keeps the prompt within the window less the reply's budget, and the template
    # renders the client's tools into the prompt too.
    async with runtime.orchestrator.turn(spec, body["messages"], requested_completion_tokens(body),
                                         body.get("tools") or (), tenant.prefix, label) as turn:
        telemetry.turn = turn
        if turn.prepared.condense_wanted and oc.codex_condense:
            runtime.condenser.want(turn.prepared.condense_wanted, tenant.owner)
        try:
            await admit(turn, runtime.governor, body, runtime.config.engine.max_model_len, runtime.session_admission,
                        runtime.metrics.one(runtime.metrics.session_wait_seconds))
        except GovernorRejected:
            turn.report.note("vram_reject")
            await record_inputs(turn, runtime)
            raise
        vllm_request = salted(request if request.context is None else rewritten(body, turn),
                              runtime.keys.cache_salt(tenant))
        await record_inputs(turn, runtime)
        current_session.set(turn.session_id)
        response = await create_chat_completion(vllm_request, raw_request)
        if isinstance(response, StreamingResponse):
            return TurnStream(response, turn.hand_over(), runtime, telemetry)
        return await finish_json(response, turn, runtime)


class TurnStream(StreamingResponse):
    """vLLM's SSE response with the cache report added, owning the turn until the response is over.

    The stream's own iterator settles the turn; closing it here as well covers a client that hangs up
    before the first chunk, when Starlette never starts the iterator and its cleanup would never run."""

    def __init__(self, source: StreamingResponse, turn: ChatTurn, runtime: Runtime, telemetry: ChatTelemetry) -> None:
        # vLLM's SSE chunks are str; Starlette types a body's chunks as any of str, bytes and memoryview.
        chunks = cast("AsyncIterable[str | bytes]", source.body_iterator)
        super().__init__(stream_with_report(chunks, turn, runtime), status_code=source.status_code,
                         background=source.background)
        self.raw_headers = [*source.raw_headers, (HEADER.lower().encode(), session_header(turn).encode("latin-1"))]
        self._turn = turn
        self._telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error: BaseException | None = None
        try:
            # The stream runs after the route has returned: its span is made current again, so the
            # reply's recording and the engine's outputs stay in the request's trace.
            with self._telemetry.current():
                await super().__call__(scope, receive, send)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._turn.close()
            self._telemetry.end(error)


def rewritten(body: dict[str, Any], turn: ChatTurn) -> ChatCompletionRequest:
    """The request vLLM gets: the client's, with the orchestrator's messages and tools. Validated again,
    since vLLM's validators read the messages and tools together."""
    data = {key: value for key, value in body.items() if key not in ("context", "prompt_cache_key")}
    data["messages"] = turn.messages
    if turn.prepared.extra_tools:
        tools = list(data.get("tools") or [])
        names = {t.get("function", {}).get("name") for t in tools if isinstance(t, dict)}
        data["tools"] = tools + [t for t in turn.prepared.extra_tools if t["function"]["name"] not in names]
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def salted(request: ChatCompletionRequest, salt: str | None) -> ChatCompletionRequest:
    """The request with its tenant's prefix-cache salt in place of the client's (None: left as sent)."""
    return request if salt is None else request.model_copy(update={"cache_salt": salt})


def session_header(turn: ChatTurn) -> str:
    """The session's id for the `X-Session-ID` response header, as the client names it."""
    return header_value(current_tenant.get().unscope(turn.session_id))


def report_json(turn: ChatTurn) -> dict[str, Any]:
    """The cache report, naming the session as the client does."""
    return turn.report.to_json(current_tenant.get().unscope(turn.session_id))


async def record_inputs(turn: ChatTurn, runtime: Runtime) -> None:
    runtime.metrics.record_context(turn.report)
    if turn.prepared.session is not None or turn.prepared.named:  # may have rows from before
        await runtime.recorder.know_session(turn.session_id)
    runtime.recorder.record_inputs(turn.prepared)


async def finish_json(response: Response | None, turn: ChatTurn, runtime: Runtime) -> Response:
    if response is None:  # the client went away; vLLM aborted the request
        return error_response(499, "client closed the request")
    if response.status_code != 200:
        return response
    assert isinstance(response.body, bytes)  # a rendered JSONResponse's, never a memoryview
    data = json.loads(response.body)
    data["context"] = report_json(turn)
    reply = data["choices"][0]["message"] if data.get("choices") else None
    await settle(turn, reply, runtime)
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
    headers[HEADER] = session_header(turn)
    return JSONResponse(data, status_code=200, headers=headers)


async def settle(turn: ChatTurn, reply: dict[str, Any] | None, runtime: Runtime) -> None:
    """A completed reply: its tool calls are recorded and durable, and it joins the session's State,
    before the client sees the response end."""
    if reply is None:
        return
    runtime.recorder.record_reply(turn.prepared, reply)
    runtime.recorder.record_turn(turn.prepared, current_usage.get())
    if reply.get("tool_calls"):
        # Like the tokens, the calls are durable before the response.
        await runtime.recorder.aflush(session_id=turn.session_id)
    await turn.commit(reply)


async def stream_with_report(chunks: AsyncIterable[str | bytes], turn: ChatTurn,
                             runtime: Runtime) -> AsyncIterator[str | bytes]:
    """Pass vLLM's SSE stream through, adding the report to the first chunk and collecting the reply;
    the turn is settled before the final `[DONE]` goes out, and closed when the stream ends.

    The event loop serves every stream: a chunk goes out as vLLM wrote it, parsed only when the reply
    needs what it holds, and only the chunk with the report is written anew."""
    # Only a session's State keeps the reply's text; its tool calls are recorded in any case.
    accumulator = ReplyAccumulator(text=turn.prepared.session is not None)
    report_due, settled = True, False
    try:
        async for chunk in chunks:
            text = chunk.decode() if isinstance(chunk, bytes) else chunk
            events = text.split("\n\n")
            rewritten = False
            for i, event in enumerate(events):
                if not event.startswith("data: "):
                    continue
                payload = event[6:]
                if payload == "[DONE]":
                    if not settled:
                        settled = True
                        await settle(turn, accumulator.message() if accumulator.finished else None, runtime)
                elif payload and (report_due or accumulator.wants(payload)):
                    data = json.loads(payload)
                    accumulator.add(data)
                    if report_due and "choices" in data:
                        data["context"] = report_json(turn)
                        events[i] = "data: " + json.dumps(data, ensure_ascii=False)
                        report_due, rewritten = False, True
            yield "\n\n".join(events) if rewritten else chunk
    finally:
        turn.close()  # not committed (cut off, an error): the State stays as it was
