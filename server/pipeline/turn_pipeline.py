"""The turn every generating door runs, one step after another: wait (for recording to keep up) →
resolve (the door reads what its request names: documents, stored items, an earlier response) →
orchestrate (the session's turn, its prompt and cache report) → admit (against the KV cache) → record
(the turn's inputs) → generate (vLLM's own route for the door, so a client hanging up cancels the
engine request) → settle (the reply joins the session's State, durably, before the client sees the
end). A door adds only its conversions: what it reads of its request, the request vLLM's route gets,
and where the reply and the cache report sit in its response.

A JSON response settles here. A stream is the door's to transform (`DoorCall.stream`): it settles the
turn when the reply completes, holding the event that ends the reply until the reply's rows are
committed (`settle_durably`), after the reply's last tokens have gone out. A settled turn whose response
went out whole (the JSON body, or the stream's last event) is delivered: no retry takes its place.

A reply's token rows, its tool calls and its turn record are made durable by one commit, which the door
waits for before its reply ends: the engine hands its last output on without waiting (`holds_end`).
Short agent turns end many times a second, and each wait for a commit is a wait the client sees."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Protocol, cast

from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from orchestrator.turn import Turn
from orchestrator.turn_request import TurnRequest
from server.admission.turn_admission import Asked, admit, wait_for_recording
from server.admission.vram_governor import GovernorRejected
from server.http.errors import error_body, error_response
from server.http.session_key import HEADER, header_value
from server.pipeline.turn_stream import TurnStream
from server.runtime import Runtime
from server.telemetry.request_telemetry import RequestTelemetry
from server.tenancy.request_context import current_session, current_tenant, current_usage
from server.tenancy.tenants import Tenant


class DoorCall(Protocol):
    """One request as its door read it, and the door's conversions around the turn."""

    @property
    def model(self) -> str | None: ...

    @property
    def tenant(self) -> Tenant: ...

    @property
    def asked(self) -> Asked:
        """What it asks to generate (admission's and the orchestrator's budget)."""

    @property
    def holds_end(self) -> bool:
        """The door makes the reply durable itself before the client sees it end (a JSON body, a single
        streamed reply): the engine then hands its last output on without waiting for the commit."""

    def refuse(self, runtime: Runtime) -> None:
        """What the server cannot serve, refused (a 4xx) before any session is touched."""

    async def resolve(self, runtime: Runtime) -> TurnRequest:
        """What the orchestrator gets, with everything the request names by reference read."""

    async def generate(self, turn: Turn, raw_request: Request) -> Response | None:
        """vLLM's route for the door on the engine request made from the prepared turn."""

    def reply(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """A JSON response's reply, as the chat message the session's State keeps."""

    async def settled(self, turn: Turn, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """The JSON response as the door sends it, once its turn has settled (the report goes in after)."""

    def stream(self, chunks: AsyncIterable[str | bytes], turn: Turn,
               pipeline: TurnPipeline) -> AsyncIterator[str | bytes]:
        """vLLM's SSE chunks as the door sends them, settling the turn through `pipeline`."""


class TurnPipeline:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def serve(self, call: DoorCall, raw_request: Request, telemetry: RequestTelemetry) -> Response:
        runtime, oc = self.runtime, self.runtime.config.orchestrator
        telemetry.model = call.model
        call.refuse(runtime)
        await wait_for_recording(runtime.recorder, oc.recording_wait_s, oc.retry_after_s)
        request = await runtime.karma.held(call.tenant, await call.resolve(runtime))
        async with runtime.orchestrator.turn(request) as turn:
            telemetry.turn = turn
            self.want_condensed(turn, call.tenant)
            await self.admit(turn, call.asked)
            await self.record_inputs(turn)
            current_session.set(turn.session_id)
            usage = current_usage.get()
            if usage is not None and call.holds_end:
                usage.route_holds_end = True  # one commit for the reply's tokens and its turn (settle_durably)
            response = await call.generate(turn, raw_request)
            if isinstance(response, StreamingResponse):  # settled by the stream, when it ends
                chunks = cast("AsyncIterable[str | bytes]", response.body_iterator)  # vLLM's SSE chunks are str
                return TurnStream(call.stream(chunks, turn, self), turn.hand_over(), telemetry,
                                  status_code=response.status_code, raw_headers=response.raw_headers,
                                  background=response.background)
            return await self.finish_json(call, response, turn)

    def want_condensed(self, turn: Turn, tenant: Tenant) -> None:
        """A Codex the orchestrator could not fit whole gets its condensed rendition made in the
        background, for the turns after this one."""
        if turn.prepared.condense_wanted and self.runtime.config.orchestrator.codex_condense:
            self.runtime.condenser.want(turn.prepared.condense_wanted, tenant.owner)

    async def admit(self, turn: Turn, asked: Asked) -> None:
        """Against the KV cache (session admission, the VRAM governor); a refused turn's inputs are
        still recorded."""
        runtime = self.runtime
        returns = runtime.returns
        priority = returns.priority(turn.session_id) if returns is not None and returns.with_priority else None
        try:
            await admit(turn, runtime.governor, asked, runtime.config.engine.max_model_len,
                        runtime.session_admission, runtime.metrics.one(runtime.metrics.session_wait_seconds),
                        priority)
        except GovernorRejected:
            turn.report.note("vram_reject")
            await self.record_inputs(turn)
            raise

    async def record_inputs(self, turn: Turn) -> None:
        """The turn's inputs and cache report, before the engine sees the request (the recording engine
        puts the tenant's salt on the prompt and records its tokens under the session)."""
        runtime = self.runtime
        runtime.metrics.record_context(turn.report)
        if turn.prepared.session is not None or turn.prepared.named:  # may have rows from before
            await runtime.recorder.know_session(turn.session_id)
        runtime.recorder.record_inputs(turn.prepared)

    async def finish_json(self, call: DoorCall, response: Response | None, turn: Turn) -> Response:
        if response is None:  # the client went away; vLLM aborted the request
            return error_response(499, "client closed the request")
        if response.status_code != 200:  # the turn rolls back
            return response
        assert isinstance(response.body, bytes)  # a rendered JSONResponse's, never a memoryview
        body = json.loads(response.body)
        report = report_json(turn)  # as the turn was prepared
        reply = call.reply(body)
        if reply is not None:
            await self.settle(turn, reply)
        else:  # nothing to settle; the tokens are still durable before the body goes out
            await self.runtime.recorder.aflush(session_id=turn.session_id)
        body = await call.settled(turn, body, reply or {})
        body["context"] = report
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
        headers[HEADER] = session_header(turn)
        # Run once the body is handed to the server for sending: the turn's reply is delivered.
        return JSONResponse(body, status_code=200, headers=headers, background=BackgroundTask(turn.delivered))

    async def settle(self, turn: Turn, reply: dict[str, Any]) -> None:
        """A completed reply: its tool calls and the turn record are recorded and committed with its tokens
        (a client that reads its session once it has the reply finds the turn there), and it joins the
        session's State."""
        self.record_end(turn, reply)
        await self.runtime.recorder.aflush(session_id=turn.session_id)
        await turn.commit(reply)

    async def settle_durably(self, turn: Turn, reply: dict[str, Any] | None) -> dict[str, Any] | None:
        """`settle` for a stream whose end is held (None: a reply that never completed, its tokens made
        durable only); the error event that ends the stream instead when the rows could not be committed,
        the turn then not committed."""
        if reply is not None:
            self.record_end(turn, reply)
        try:
            await self.runtime.recorder.aflush(session_id=turn.session_id)
        except Exception as exc:  # as vLLM reports an engine failure mid-stream
            return error_body(500, f"the reply could not be recorded: {exc}", "server_error")
        if reply is not None:
            await turn.commit(reply)
        return None

    def record_end(self, turn: Turn, reply: dict[str, Any]) -> None:
        """The reply's tool calls and the turn record, queued after its tokens."""
        recorder, usage = self.runtime.recorder, current_usage.get()
        recorder.record_reply(turn.prepared, reply)
        recorder.record_turn(turn.prepared, usage)
        if usage is not None and usage.texts is not None:  # the trace records the conversation
            usage.reply = reply


def session_header(turn: Turn) -> str:
    """The session's id for the `X-Session-ID` response header, as the client names it."""
    return header_value(current_tenant.get().unscope(turn.session_id))


def report_json(turn: Turn) -> dict[str, Any]:
    """The cache report, naming the session as the client does."""
    return turn.report.to_json(current_tenant.get().unscope(turn.session_id))
