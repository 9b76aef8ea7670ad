"""The chat pipeline: the orchestrator rewrites the request's messages from `context` (or leaves them
as sent) inside a `ChatTurn`, the turn is admitted against the KV cache, vLLM's chat handler generates,
and the reply settles into the session's State. vLLM's response comes back unchanged except for the
cache report (`context`), which goes into the JSON body or the first streamed chunk. The turn commits
when the reply completes and rolls back otherwise.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, cast

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from orchestrator.chat_turn import ChatTurn
from orchestrator.context_spec import ContextSpec
from server.admission.turn_admission import Asked, admit, wait_for_recording
from server.admission.vram_governor import GovernorRejected
from server.chat.protocol import ChatCall
from server.chat.stream_reply import ReplyAccumulator
from server.emulation.grammar import refuse_chat_grammar
from server.http.errors import error_body, error_response
from server.http.session_key import HEADER, header_value
from server.runtime import Runtime
from server.telemetry.chat_telemetry import ChatTelemetry
from server.tenancy.request_context import EngineUsage, current_session, current_tenant, current_usage


class ChatService:
    """The work of one chat request, step by step: prepare → admit → generate → settle."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def serve(self, call: ChatCall, raw_request: Request, telemetry: ChatTelemetry) -> Response:
        runtime, oc = self.runtime, self.runtime.config.orchestrator
        telemetry.model = call.request.model
        refuse_chat_grammar(runtime.config.engine.emulate, call.request)
        await wait_for_recording(runtime.recorder, oc.recording_wait_s, oc.retry_after_s)
        spec = await self.resolve(call)
        async with runtime.orchestrator.turn(call.turn_request(spec)) as turn:
            telemetry.turn = turn
            self.prepare(turn, call)
            await self.admit(turn, call.asked)
            response = await self.generate(turn, call, raw_request)
            if isinstance(response, StreamingResponse):  # settled by the stream, when it ends
                chunks = cast("AsyncIterable[str | bytes]", response.body_iterator)  # vLLM's SSE chunks are str
                return TurnStream(stream_with_report(chunks, turn, runtime, telemetry.usage), turn.hand_over(),
                                  telemetry, status_code=response.status_code, raw_headers=response.raw_headers,
                                  background=response.background)
            return await finish_json(response, turn, runtime)

    async def resolve(self, call: ChatCall) -> ContextSpec | None:
        """Documents named by reference, read from XDB with their stored renditions."""
        if call.spec is None:
            return None
        return await self.runtime.codex.resolve(call.spec, call.tenant.owner)

    def prepare(self, turn: ChatTurn, call: ChatCall) -> None:
        """The orchestrator has prepared the turn on entering it; a Codex it could not fit whole gets
        its condensed rendition made in the background, for the turns after this one."""
        if turn.prepared.condense_wanted and self.runtime.config.orchestrator.codex_condense:
            self.runtime.condenser.want(turn.prepared.condense_wanted, call.tenant.owner)

    async def admit(self, turn: ChatTurn, asked: Asked) -> None:
        """Against the KV cache (session admission, the VRAM governor); a refused turn's inputs are
        still recorded. Every generating door admits its turn here."""
        runtime = self.runtime
        try:
            await admit(turn, runtime.governor, asked, runtime.config.engine.max_model_len,
                        runtime.session_admission, runtime.metrics.one(runtime.metrics.session_wait_seconds))
        except GovernorRejected:
            turn.report.note("vram_reject")
            await record_inputs(turn, runtime)
            raise

    async def generate(self, turn: ChatTurn, call: ChatCall, raw_request: Request) -> Response | None:
        """vLLM's own handler on the orchestrator's request (the client's, when it sent no context); the
        turn's inputs are recorded first (the recording engine puts the tenant's salt on the prompt)."""
        from vllm.entrypoints.openai.chat_completion.api_router import create_chat_completion

        request = call.request if call.request.context is None else rewritten(call.body, turn)
        await record_inputs(turn, self.runtime)
        current_session.set(turn.session_id)
        usage = current_usage.get()
        if usage is not None and request.stream and (request.n or 1) == 1:
            usage.route_holds_end = True  # the stream's finish waits for the reply's rows (stream_with_report)
        response: Response | None = await create_chat_completion(request, raw_request)
        return response


class TurnStream(StreamingResponse):
    """A streamed reply (SSE) owning its turn until the response is over, with the session's header.

    The stream's own iterator settles the turn; closing it here as well covers a client that hangs up
    before the first chunk, when Starlette never starts the iterator and its cleanup would never run.
    `raw_headers`: the response's, where vLLM made one (its content type among them)."""

    def __init__(self, body: AsyncIterable[str | bytes], turn: ChatTurn, telemetry: ChatTelemetry, *,
                 status_code: int = 200, raw_headers: list[tuple[bytes, bytes]] | None = None,
                 background: BackgroundTask | None = None) -> None:
        super().__init__(body, status_code=status_code, background=background, media_type="text/event-stream")
        if raw_headers is not None:
            self.raw_headers = list(raw_headers)
        self.raw_headers.append((HEADER.lower().encode(), session_header(turn).encode("latin-1")))
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


async def stream_with_report(chunks: AsyncIterable[str | bytes], turn: ChatTurn, runtime: Runtime,
                             usage: EngineUsage | None = None) -> AsyncIterator[str | bytes]:
    """Pass vLLM's SSE stream through, adding the report to the first chunk and collecting the reply;
    the turn is settled before the final `[DONE]` goes out, and closed when the stream ends.

    The event loop serves every stream: a chunk goes out as vLLM wrote it, parsed only when the reply
    needs what it holds, and only the chunk with the report is written anew.

    The reply is durable before the client sees it finish: with `usage.durable` (the engine handed its
    last output on without waiting), the chunk that finishes the reply is held until the reply's rows
    are committed. Its last tokens go out first, in a chunk of their own, so that wait never lengthens
    the gap before the last token; the finish follows with an empty delta, as OpenAI's streams end."""
    # The reply's text is kept where the turn needs it: a session's State, or the conversation's chain, which
    # the client's next request (with this reply resent) must match. Its tool calls are recorded in any case.
    accumulator = ReplyAccumulator(text=turn.prepared.session is not None or turn.prepared.conversation is not None)
    report_due, settled, held = True, False, usage is not None and usage.route_holds_end
    try:
        async for chunk in chunks:
            text = chunk.decode() if isinstance(chunk, bytes) else chunk
            if not report_due and accumulator.take(text):
                yield chunk  # the usual chunk: tokens only, their text (if kept) taken as it stands
                continue
            events = text.split("\n\n")
            out: list[str] = []
            rewritten = False
            for event in events:
                payload = event[6:] if event.startswith("data: ") else ""
                if payload == "[DONE]":
                    if held:  # no finish chunk came (an error): the rows still go first
                        held = False
                        if (failure := await made_durable(usage)) is not None:
                            yield "\n\n".join([*out, failure, "data: [DONE]", ""])
                            return
                    if not settled:
                        settled = True
                        await settle(turn, accumulator.message() if accumulator.finished else None, runtime)
                elif payload and (report_due or not accumulator.take(payload)):
                    data = json.loads(payload)
                    accumulator.add(data)
                    if report_due and "choices" in data:
                        data["context"] = report_json(turn)
                        event = "data: " + json.dumps(data, ensure_ascii=False)
                        report_due, rewritten = False, True
                    if held and accumulator.finished:
                        held, rewritten = False, True
                        tokens, finish = split_finish(data)
                        if tokens is not None:
                            yield "\n\n".join([*out, "data: " + json.dumps(tokens, ensure_ascii=False), ""])
                            out = []
                        if (failure := await made_durable(usage)) is not None:
                            yield "\n\n".join([*out, failure, "data: [DONE]", ""])
                            return
                        event = "data: " + json.dumps(finish, ensure_ascii=False)
                out.append(event)
            yield "\n\n".join(out) if rewritten else chunk
    finally:
        turn.close()  # not committed (cut off, an error): the State stays as it was


async def made_durable(usage: EngineUsage | None) -> str | None:
    """Until the engine's last output is recorded and committed (a client going away meanwhile does not
    cancel the recording); the error event that ends the stream instead when it could not be."""
    if usage is None or usage.durable is None:
        return None
    try:
        await asyncio.shield(usage.durable)
    except Exception as exc:  # as vLLM reports an engine failure mid-stream; the turn is not committed
        return "data: " + json.dumps(error_body(500, f"the reply could not be recorded: {exc}", "server_error"))
    return None


def split_finish(data: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """A finishing chunk as (its tokens without the finish, the finish with an empty delta); no tokens
    chunk when the finish carries no tokens."""
    choice = data["choices"][0]
    if not any(choice.get("delta", {}).values()) and not choice.get("logprobs") and not choice.get("token_ids"):
        return None, data
    # The tokens as vLLM streams a token that does not finish: no finish or stop reason.
    tokens_choice = {key: value for key, value in choice.items() if key != "stop_reason"}
    tokens = {key: value for key, value in data.items() if key != "system_fingerprint"}  # a terminal chunk's
    tokens["choices"] = [{**tokens_choice, "finish_reason": None}]
    finish = {key: value for key, value in data.items() if key != "context"}  # the report: first chunk only
    finish["choices"] = [{**choice, "delta": {}, **{key: None for key in ("logprobs", "token_ids") if key in choice}}]
    return tokens, finish
