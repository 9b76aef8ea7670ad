"""One chat request's log line and trace span, opened when the request arrives and closed when its
response ends (for a stream, when the stream does), whatever became of it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from core.spans import (
    CACHE_READ_INPUT_TOKENS,
    CONVERSATION_ID,
    DOOR,
    INPUT_MESSAGES,
    INPUT_TOKENS,
    OPERATION_NAME,
    OUTCOME,
    OUTPUT_MESSAGES,
    OUTPUT_TOKENS,
    PROVIDER_NAME,
    REQUEST_CHOICE_COUNT,
    REQUEST_FREQUENCY_PENALTY,
    REQUEST_MAX_TOKENS,
    REQUEST_MODEL,
    REQUEST_PRESENCE_PENALTY,
    REQUEST_SEED,
    REQUEST_STOP_SEQUENCES,
    REQUEST_TEMPERATURE,
    REQUEST_TOP_K,
    REQUEST_TOP_P,
    RESPONSE_FINISH_REASONS,
    RESPONSE_ID,
    RESPONSE_MODEL,
    TENANT,
)
from orchestrator.orchestrator import prompt_attributes
from orchestrator.turn import Turn
from server.telemetry.genai_messages import input_messages, output_messages, settled_output
from server.telemetry.tracing import records_content, start_request_span
from server.tenancy.request_context import EngineUsage, current_tenant, current_usage

log = logging.getLogger("ahc.requests")

OPERATION = "chat"  # the GenAI operation of every door: the Messages and Responses APIs are chats too
# A request body's sampling fields, whichever door's (chat completions, Messages, Responses), as the
# GenAI attribute each sets, and its type there. Where two name the same (chat's `max_tokens` and
# `max_completion_tokens`), the later one wins, as in vLLM.
REQUEST_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "max_tokens": (REQUEST_MAX_TOKENS, int),
    "max_completion_tokens": (REQUEST_MAX_TOKENS, int),
    "max_output_tokens": (REQUEST_MAX_TOKENS, int),
    "temperature": (REQUEST_TEMPERATURE, float),
    "top_p": (REQUEST_TOP_P, float),
    "top_k": (REQUEST_TOP_K, int),
    "frequency_penalty": (REQUEST_FREQUENCY_PENALTY, float),
    "presence_penalty": (REQUEST_PRESENCE_PENALTY, float),
    "seed": (REQUEST_SEED, int),
    "stop": (REQUEST_STOP_SEQUENCES, lambda stop: [stop] if isinstance(stop, str) else [str(s) for s in stop]),
    "stop_sequences": (REQUEST_STOP_SEQUENCES, lambda stop: [str(s) for s in stop]),
}


class RequestTelemetry:
    def __init__(self, headers: Mapping[str, str], door: str = "chat") -> None:
        """`door`: the API the request came by (`chat`, `messages`, `responses`), naming its log line.
        The span is named after the GenAI operation, and its model once that is read."""
        self.door = door
        self.span = start_request_span(headers, OPERATION, {
            OPERATION_NAME: OPERATION, PROVIDER_NAME: "vllm", DOOR: door, TENANT: current_tenant.get().name})
        # What the engine reports of the prompt, once it has seen it, and of the reply.
        self.usage = EngineUsage(texts={} if records_content() else None)
        self.turn: Turn | None = None  # set once the orchestrator has prepared the prompt
        self._model: str | None = None
        self._ended = False

    @property
    def model(self) -> str | None:
        """The model the request names, once it is read."""
        return self._model

    @model.setter
    def model(self, model: str | None) -> None:
        self._model = model
        self.span.update_name(OPERATION if model is None else f"{OPERATION} {model}")

    def requested(self, body: Any) -> None:
        """Read the request's body: its model and sampling parameters, which the span shows as sent."""
        if not isinstance(body, dict):
            return
        if isinstance(body.get("model"), str):
            self.model = body["model"]
        if self.span.is_recording():
            self.span.set_attributes(request_attributes(body))

    @contextmanager
    def current(self) -> Iterator[None]:
        """Run a part of the request with its span current and its usage where the engine records it."""
        token = current_usage.set(self.usage)
        try:
            with trace.use_span(self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                yield
        finally:
            current_usage.reset(token)

    def end(self, error: BaseException | None = None) -> None:
        """The response is over: the log line, and the span with what is now known; once."""
        if self._ended:
            return
        self._ended = True
        outcome = outcome_of(self.turn, error)
        if log.isEnabledFor(logging.INFO):
            fields = " ".join(f"{key}={value}" for key, value in self.fields(outcome).items())
            log.info("%s %s", self.door, fields)
        if self.span.is_recording():
            self.span.set_attributes(self.attributes())
            self.span.set_attribute(OUTCOME, outcome)
            if error is not None:
                self.span.record_exception(error)
                self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()

    def fields(self, outcome: str) -> dict[str, Any]:
        """The log line's fields; `-` for what the request never got to (a prompt, the engine)."""
        report = self.turn.report if self.turn is not None else None
        return {
            "session": self.turn.session_id if self.turn is not None else "-",
            "mode": report.mode if report is not None else "-",
            "prompt_tokens": _or_dash(self.usage.prompt_tokens),
            "cached_tokens": _or_dash(self.usage.cached_tokens),
            "first_changed_block": (report.first_changed_block or "none") if report is not None else "-",
            "governor": ",".join(report.governor) if report is not None and report.governor else "-",
            "outcome": outcome,
        }

    def attributes(self) -> dict[str, Any]:
        """The request span's attributes at its end: the prompt's, the engine's response and usage, and
        the conversation when the user asked for it."""
        attributes: dict[str, Any] = {}
        if self.model is not None:
            attributes[REQUEST_MODEL] = self.model
        if self.turn is not None:
            attributes.update(prompt_attributes(self.turn.prepared))
            attributes[CONVERSATION_ID] = self.turn.session_id
        attributes.update(self.response_attributes())
        if self.usage.texts is not None:
            if self.turn is not None:
                attributes[INPUT_MESSAGES] = input_messages(self.turn.prepared.messages)
            if self.usage.reply is not None and len(self.usage.texts) <= 1:  # n > 1: every choice as made
                attributes[OUTPUT_MESSAGES] = settled_output(self.usage.reply, self.usage.finish_reasons.get(0))
            elif self.usage.texts:  # not settled (cut off): what the engine made
                attributes[OUTPUT_MESSAGES] = output_messages(self.usage.texts, self.usage.finish_reasons)
        return attributes

    def response_attributes(self) -> dict[str, Any]:
        """The engine's response and its usage, once it has seen the prompt; nothing before."""
        usage = self.usage
        if usage.prompt_tokens is None:
            return {}
        attributes: dict[str, Any] = {INPUT_TOKENS: usage.prompt_tokens, OUTPUT_TOKENS: usage.completion_tokens,
                                      CACHE_READ_INPUT_TOKENS: usage.cached_tokens or 0}
        if usage.request_id is not None:
            attributes[RESPONSE_ID] = response_id(self.door, usage.request_id)
        if usage.model is not None:
            attributes[RESPONSE_MODEL] = usage.model
        if usage.finish_reasons:
            attributes[RESPONSE_FINISH_REASONS] = [usage.finish_reasons[i] for i in sorted(usage.finish_reasons)]
        return attributes


def request_attributes(body: dict[str, Any]) -> dict[str, Any]:
    """The GenAI request attributes of what a request body sets (null or invalid fields left out)."""
    attributes: dict[str, Any] = {}
    for key, (name, kind) in REQUEST_FIELDS.items():
        if body.get(key) is not None:
            try:
                attributes[name] = kind(body[key])
            except (TypeError, ValueError):  # the route's validation answers it
                continue
    if isinstance(body.get("n"), int) and body["n"] != 1:
        attributes[REQUEST_CHOICE_COUNT] = body["n"]
    return attributes


def response_id(door: str, request_id: str) -> str:
    """The id of the response the client got: the route's request id, less the `_N` that vLLM's Responses
    handler numbers each of a response's engine requests with."""
    if door != "responses" or "_" not in request_id:
        return request_id
    return request_id.rpartition("_")[0]


def outcome_of(turn: Turn | None, error: BaseException | None) -> str:
    """`committed` (the reply completed and joined the session), the error that ended the request, or
    `incomplete` (an error response from vLLM, a client gone before the end)."""
    if error is not None:
        return type(error).__name__
    return "committed" if turn is not None and turn.committed else "incomplete"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
