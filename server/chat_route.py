"""`POST /v1/chat/completions` with the orchestrator in front of vLLM's own handler.

The route reads the request, lets the orchestrator rewrite its messages from the `context` field (or
leaves them as sent), then hands a normal `ChatCompletionRequest` to vLLM's chat handler. The response
comes back from vLLM unchanged except for the cache report (`context`), which goes into the JSON body
or the first streamed chunk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.responses import JSONResponse, Response, StreamingResponse

from orchestrator.context_spec import field_of, parse_context
from orchestrator.orchestrator import Orchestrator, Prepared
from orchestrator.retrieval import CodexTooLarge
from server.errors import error_response
from server.request_context import RequestRecord, current_record
from server.stream_reply import ReplyAccumulator
from orchestrator.vram_governor import GovernorRejected


@dataclass
class ChatHooks:
    """What the route needs from the rest of the server."""

    orchestrator: Orchestrator
    admit: Callable[[Prepared, dict[str, Any]], Any]  # async VRAM admission -> Prepared; raises GovernorRejected
    on_prepared: Callable[[Prepared], None]  # metrics and input recording
    on_reply: Callable[[Prepared, dict[str, Any] | None], None]  # tool-call recording
    flush: Callable[[], Any]  # async: everything recorded so far is committed


def install_chat_route(app: FastAPI, hooks: ChatHooks) -> None:
    """Put our route ahead of vLLM's on the same path (Starlette matches routes in order)."""

    async def chat_completions(raw_request: Request) -> Response:
        return await handle_chat(raw_request, hooks)

    route = APIRoute("/v1/chat/completions", chat_completions, methods=["POST"], include_in_schema=True,
                     name="ahc_chat_completions")
    app.router.routes.insert(0, route)


async def handle_chat(raw_request: Request, hooks: ChatHooks) -> Response:
    from vllm.entrypoints.openai.chat_completion.api_router import create_chat_completion
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    try:
        body = json.loads(await raw_request.body())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return error_response(400, f"The request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return error_response(400, "The request body must be a JSON object.")
    raw_context = body.pop("context", None)
    try:
        spec = parse_context(raw_context) if raw_context is not None else None
    except ValueError as exc:
        return error_response(400, str(exc), param=field_of(exc))

    lock = hooks.orchestrator.sessions.lock(spec.session_id) if spec and spec.session_id else None
    if lock is not None:
        await lock.acquire()
    handed_over = False  # a streaming response releases the lock when the stream ends
    try:
        response = await run_chat(raw_request, body, spec, hooks, create_chat_completion, ChatCompletionRequest)
        if isinstance(response, tuple):  # (vLLM's streaming response, its prepared request)
            streaming, prepared = response
            streaming.body_iterator = stream_with_report(streaming.body_iterator, prepared, hooks, lock)
            handed_over = True
            return streaming
        return response
    finally:
        if lock is not None and not handed_over:
            lock.release()


async def run_chat(raw_request: Request, body: dict[str, Any], spec, hooks: ChatHooks,
                   create_chat_completion, request_model) -> Response | tuple[StreamingResponse, Prepared]:
    try:
        prepared = await hooks.orchestrator.prepare(spec, body.get("messages"))
    except CodexTooLarge as exc:
        return error_response(413, str(exc), param="context.codex")
    except ValueError as exc:
        return error_response(400, str(exc), param=field_of(exc))
    try:
        body["messages"] = prepared.messages
        add_tools(body, prepared.extra_tools)
        try:
            request = request_model.model_validate(body)
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
        try:
            admitted = await hooks.admit(prepared, body)
        except GovernorRejected as exc:
            prepared.report["governor"].append("vram_reject")
            hooks.on_prepared(prepared)
            hooks.orchestrator.complete(prepared, None)
            return error_response(429, str(exc), "rate_limit_error", "kv_cache_full",
                                  headers={"Retry-After": str(exc.retry_after_s)})
        if admitted is not prepared:  # compacted to fit: the request carries the new messages
            prepared = admitted
            request = request_model.model_validate(body)
        hooks.on_prepared(prepared)
        current_record.set(RequestRecord(session_id=prepared.session_id, prepared=prepared))
        response = await create_chat_completion(request, raw_request)
    except BaseException:
        hooks.orchestrator.complete(prepared, None)
        raise
    if isinstance(response, StreamingResponse):
        return response, prepared
    return await finish_json(response, prepared, hooks)


def add_tools(body: dict[str, Any], extra: list[dict[str, Any]]) -> None:
    if not extra:
        return
    tools = list(body.get("tools") or [])
    names = {t.get("function", {}).get("name") for t in tools if isinstance(t, dict)}
    tools += [t for t in extra if t["function"]["name"] not in names]
    body["tools"] = tools


def report_of(prepared: Prepared) -> dict[str, Any]:
    return {**prepared.report, "session_id": prepared.session_id}


async def settle(receipt: Any) -> None:
    """Wait for a session save handed to a worker thread: a completed reply's State is durable."""
    if isinstance(receipt, concurrent.futures.Future):
        await asyncio.wrap_future(receipt)


async def finish_json(response: Response | None, prepared: Prepared, hooks: ChatHooks) -> Response:
    if response is None:  # the client went away; vLLM aborted the request
        hooks.orchestrator.complete(prepared, None)
        return error_response(499, "client closed the request")
    if response.status_code != 200:
        hooks.orchestrator.complete(prepared, None)
        return response
    data = json.loads(response.body)
    data["context"] = report_of(prepared)
    reply = data["choices"][0]["message"] if data.get("choices") else None
    hooks.on_reply(prepared, reply)
    if reply and reply.get("tool_calls"):
        await hooks.flush()  # like the tokens, the calls are durable before the response
    await settle(hooks.orchestrator.complete(prepared, reply))
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
    return JSONResponse(data, status_code=200, headers=headers)


async def stream_with_report(chunks: AsyncIterator[str | bytes], prepared: Prepared, hooks: ChatHooks,
                             lock) -> AsyncIterator[str]:
    """Pass vLLM's SSE stream through, adding the report to the first chunk and collecting the reply;
    the session is settled before the final `[DONE]` goes out."""
    accumulator = ReplyAccumulator()
    first, settled = True, False
    try:
        async for chunk in chunks:
            text = chunk.decode() if isinstance(chunk, bytes) else chunk
            events = []
            for event in text.split("\n\n"):
                payload = event.removeprefix("data: ") if event.startswith("data: ") else None
                if payload == "[DONE]" and not settled:
                    settled = True
                    reply = accumulator.message() if accumulator.finished else None
                    hooks.on_reply(prepared, reply)
                    if reply and reply.get("tool_calls"):
                        await hooks.flush()
                    await settle(hooks.orchestrator.complete(prepared, reply))
                elif payload:
                    data = json.loads(payload)
                    accumulator.add(data)
                    if first and "choices" in data:
                        data["context"] = report_of(prepared)
                        first = False
                    event = "data: " + json.dumps(data, ensure_ascii=False)
                events.append(event)
            yield "\n\n".join(events)
    finally:
        if not settled:  # cut off (client gone, error): the State stays as it was
            hooks.orchestrator.complete(prepared, None)
        if lock is not None:
            lock.release()
