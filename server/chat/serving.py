"""The chat completions door on the turn pipeline (server/pipeline/turn_pipeline.py): the orchestrator
rewrites the request's messages from `context` (or leaves them as sent), vLLM's own chat route
generates, and vLLM's response comes back unchanged except for the cache report (`context`), which goes
into the JSON body or the first streamed chunk.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import Response
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from orchestrator.turn import Turn
from orchestrator.turn_request import TurnRequest
from server.admission.turn_admission import Asked
from server.chat.protocol import ChatCall
from server.chat.stream_reply import ReplyAccumulator
from server.emulation.grammar import refuse_chat_grammar
from server.pipeline.turn_pipeline import TurnPipeline, report_json
from server.runtime import Runtime
from server.tenancy.request_context import EngineUsage, current_usage
from server.tenancy.tenants import Tenant


@dataclass
class ChatDoorCall:
    """A chat request on the turn pipeline (server/pipeline/turn_pipeline.py): vLLM's chat route on the
    orchestrator's messages, the reply from the response's first choice, the report in the JSON body or
    the first streamed chunk."""

    call: ChatCall

    @property
    def model(self) -> str | None:
        return self.call.request.model

    @property
    def tenant(self) -> Tenant:
        return self.call.tenant

    @property
    def asked(self) -> Asked:
        return self.call.asked

    @property
    def holds_end(self) -> bool:
        return not self.call.request.stream or (self.call.request.n or 1) == 1

    def refuse(self, runtime: Runtime) -> None:
        refuse_chat_grammar(runtime.config.engine.emulate, self.call.request)

    async def resolve(self, runtime: Runtime) -> TurnRequest:
        """The `context`'s documents named by reference, read from XDB with their stored renditions."""
        spec = self.call.spec
        if spec is not None:
            spec = await runtime.codex.resolve(spec, self.call.tenant.owner)
        return self.call.turn_request(spec)

    async def generate(self, turn: Turn, raw_request: Request) -> Response | None:
        """vLLM's own chat route on the orchestrator's request (the client's, when it sent no context)."""
        from vllm.entrypoints.openai.chat_completion.api_router import create_chat_completion

        call = self.call
        request = call.request if call.request.context is None else rewritten(call.body, turn)
        response: Response | None = await create_chat_completion(request, raw_request)
        return response

    def reply(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return body["choices"][0]["message"] if body.get("choices") else None

    async def settled(self, turn: Turn, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        return body

    def stream(self, chunks: AsyncIterable[str | bytes], turn: Turn,
               pipeline: TurnPipeline) -> AsyncIterator[str | bytes]:
        return stream_with_report(chunks, turn, pipeline, current_usage.get())


def rewritten(body: dict[str, Any], turn: Turn) -> ChatCompletionRequest:
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


async def stream_with_report(chunks: AsyncIterable[str | bytes], turn: Turn, pipeline: TurnPipeline,
                             usage: EngineUsage | None = None) -> AsyncIterator[str | bytes]:
    """Pass vLLM's SSE stream through, adding the report to the first chunk and collecting the reply;
    the turn is settled before the final `[DONE]` goes out, and closed when the stream ends.

    The event loop serves every stream: a chunk goes out as vLLM wrote it, parsed only when the reply
    needs what it holds, and only the chunk with the report is written anew.

    The reply is durable before the client sees it finish: with `usage.route_holds_end` (the engine
    handed its last output on without waiting), the chunk that finishes the reply is held until the
    reply's rows are committed and the turn settled (`TurnPipeline.settle_durably`). Its last tokens go
    out first, in a chunk of their own, so that wait never lengthens the gap before the last token; the
    finish follows with an empty delta, as OpenAI's streams end."""
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
                        held, settled = False, True
                        if (failure := await pipeline.settle_durably(turn, None)) is not None:
                            yield "\n\n".join([*out, "data: " + json.dumps(failure), "data: [DONE]", ""])
                            return
                    if not settled:
                        settled = True
                        if accumulator.finished:
                            await pipeline.settle(turn, accumulator.message())
                elif payload and (report_due or not accumulator.take(payload)):
                    data = json.loads(payload)
                    accumulator.add(data)
                    if report_due and "choices" in data:
                        data["context"] = report_json(turn)
                        event = "data: " + json.dumps(data, ensure_ascii=False)
                        report_due, rewritten = False, True
                    if held and accumulator.finished:
                        held, settled, rewritten = False, True, True
                        tokens, finish = split_finish(data)
                        if tokens is not None:
                            yield "\n\n".join([*out, "data: " + json.dumps(tokens, ensure_ascii=False), ""])
                            out = []
                        reply = accumulator.message()
                        if (failure := await pipeline.settle_durably(turn, reply)) is not None:
                            yield "\n\n".join([*out, "data: " + json.dumps(failure), "data: [DONE]", ""])
                            return
                        event = "data: " + json.dumps(finish, ensure_ascii=False)
                out.append(event)
            yield "\n\n".join(out) if rewritten else chunk
    finally:
        turn.close()  # not committed (cut off, an error): the State stays as it was


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
