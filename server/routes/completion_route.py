"""`POST /v1/completions` (OpenAI's legacy text completions) through AHC's admission and recording.

vLLM's own handler serves it; in front of it, the route makes the request a session in XDB (each
prompt an `input` row, every generated token an `output` row, all under one session id, even for a
batch of prompts: the session the client names in `X-Session-ID` or `prompt_cache_key`, else a new
one), and reserves the KV blocks its prompts and completions will take, as chat does: short of blocks
it waits, then answers 429 with Retry-After instead of pushing vLLM into preemption.
The reservation is released when the response, JSON or stream, is over.

Prompts are measured before anything else reads them: a token-id prompt by its length, a text by the
tokenizer off the event loop (a very long one in the token-counting child process, since the
tokenizer holds the GIL while it builds its result: a 20 MB text stalled every request for a second).
One longer than the window is a 400 before vLLM tokenizes it again or the recorder decodes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import ConfigDict, field_validator
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from core.errors import InvalidRequest
from orchestrator.orchestrator import new_session_id
from server.admission.turn_admission import Asked, request_blocks, wait_for_recording
from server.http.session_key import HEADER, header_value, session_key, unicode_id
from server.pipeline.door import install_ahead
from server.runtime import Runtime
from server.tenancy.request_context import current_session, current_tenant

PATH = "/v1/completions"


def _prompt_required(schema: dict[str, Any]) -> None:
    schema["required"] = sorted({*schema.get("required", []), "prompt"})


class CompletionBody(CompletionRequest):
    """vLLM's request as AHC serves it: `prompt` is required, as in OpenAI's API (vLLM's model leaves it
    optional for prompt embeddings, which AHC does not enable: a body without one is a 400 either
    way). Only the OpenAPI document changes, so clients and fuzzers generated from it send a prompt."""

    model_config = ConfigDict(json_schema_extra=_prompt_required)
    # A client's `request_id` names the request's rows in XDB ("cmpl-" and it): UTF-8 must hold it.
    _request_id = field_validator("request_id")(unicode_id)


def install_completion_route(app: FastAPI, runtime: Runtime) -> None:
    """Ahead of vLLM's route on the same path (Starlette matches routes in order)."""

    async def completions(request: CompletionBody, raw_request: Request) -> Response:
        return await serve_completion(request, raw_request, runtime)

    install_ahead(app, APIRoute(PATH, completions, methods=["POST"], name="ahc_completions", response_model=None))


def prompts_of(request: CompletionRequest) -> list[str | list[int]]:
    """Each prompt of the request: a text or token ids (a batch is a list of either)."""
    prompt: Any = request.prompt
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return [p if isinstance(p, str) else list(p) for p in prompt or []]


async def serve_completion(request: CompletionRequest, raw_request: Request, runtime: Runtime) -> Response:
    from vllm.entrypoints.openai.completion.api_router import create_completion

    oc, max_model_len = runtime.config.orchestrator, runtime.config.engine.max_model_len
    await wait_for_recording(runtime.recorder, oc.recording_wait_s, oc.retry_after_s)
    prompts = prompts_of(request)
    lengths = [await prompt_tokens(runtime, p, i, max_model_len) for i, p in enumerate(prompts)]
    asked = Asked.of(request.max_tokens, request.n)
    blocks = sum(request_blocks(runtime.governor, asked, max_model_len, n, 0) for n in lengths)
    named = session_key(None, raw_request.headers.get(HEADER), (request.model_extra or {}).get("prompt_cache_key"))
    reservation = await runtime.governor.admit(blocks)
    try:
        tenant = current_tenant.get()
        session = tenant.scope(named.session_id if named.session_id is not None else new_session_id())
        if named.session_id is not None:
            await runtime.recorder.know_session(session)
        record_prompts(runtime, session, prompts, fresh=named.session_id is None)
        current_session.set(session)  # the engine's outputs of every prompt go to this session
        # The recording engine puts the tenant's salt on each prompt, in place of the client's.
        response: Response = await create_completion(request, raw_request)  # vLLM's route is unannotated
    except BaseException:
        reservation.release()
        raise
    response.headers[HEADER] = header_value(tenant.unscope(session))
    if isinstance(response, StreamingResponse):
        return ReleasingStream(response, reservation.release)
    reservation.release()
    return response


async def prompt_tokens(runtime: Runtime, prompt: str | list[int], index: int, window: int) -> int:
    """The prompt's tokens; over the window it is a 400 (`context_length_exceeded`)."""
    if isinstance(prompt, list):
        tokens = len(prompt)
    else:
        # Without the special tokens vLLM adds: at the window's edge vLLM's own check still applies.
        process, encode = runtime.token_process, runtime.orchestrator.counter.encode
        tokens = await asyncio.to_thread(process.count if process is not None else lambda t: len(encode(t)), prompt)
    if tokens > window:
        raise InvalidRequest(f"prompt {index} is {tokens:,} tokens, over the model's {window:,}-token window",
                             param="prompt", code="context_length_exceeded")
    return tokens


def record_prompts(runtime: Runtime, session: str, prompts: list[str | list[int]], fresh: bool = True) -> None:
    """Each prompt as an `input` row of the request's session (token ids are decoded). `fresh`: an id
    made for this request, so no rows to continue from; one the client named may have some."""
    recorder = runtime.recorder
    if fresh:
        recorder.xdb.start_session(session)
    events: list[tuple[str, str | None, str, dict[str, Any] | None]] = [
        ("input", "user", p if isinstance(p, str) else runtime.tokenizer.decode(p),
         {"prompt_index": i, "endpoint": "completions"} | ({"prompt_token_ids": len(p)} if isinstance(p, list) else {}))
        for i, p in enumerate(prompts)]
    recorder.submit(recorder.rows(session, events))


class ReleasingStream(StreamingResponse):
    """vLLM's SSE response, unchanged, that gives back the reservation when it ends however it ends
    (including a client gone before the first chunk, when Starlette never runs the iterator)."""

    def __init__(self, source: StreamingResponse, release: Callable[[], None]) -> None:
        super().__init__(source.body_iterator, status_code=source.status_code, background=source.background)
        self.raw_headers = source.raw_headers
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
