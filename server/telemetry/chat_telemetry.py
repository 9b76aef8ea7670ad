"""One chat request's log line and trace span, opened when the request arrives and closed when its
response ends (for a stream, when the stream does), whatever became of it."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from ahc.core.spans import (
    CACHE_READ_INPUT_TOKENS,
    CONVERSATION_ID,
    INPUT_TOKENS,
    OPERATION_NAME,
    OUTPUT_TOKENS,
    PROVIDER_NAME,
    REQUEST_MODEL,
)
from orchestrator.chat_turn import ChatTurn
from orchestrator.orchestrator import prompt_attributes
from server.telemetry.tracing import start_request_span
from server.tenancy.request_context import EngineUsage, current_usage

log = logging.getLogger("ahc.chat")


class ChatTelemetry:
    def __init__(self, headers: Mapping[str, str], door: str = "chat") -> None:
        """`door`: the API the request came by (`chat`, `messages`), naming its span and log line."""
        self.door = door
        self.span = start_request_span(f"ahc.{door}", headers)
        self.usage = EngineUsage()  # what the engine reports of the prompt, once it has seen it
        self.turn: ChatTurn | None = None  # set once the orchestrator has prepared the prompt
        self.model: str | None = None  # the model the request names, once it is read
        self._ended = False

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
            self.span.set_attribute("ahc.outcome", outcome)
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
        """The request span's attributes: the prompt's, with the engine's own token counts where known."""
        attributes = prompt_attributes(self.turn.prepared) if self.turn is not None else {}
        attributes[OPERATION_NAME], attributes[PROVIDER_NAME] = "chat", "vllm"
        if self.model is not None:
            attributes[REQUEST_MODEL] = self.model
        if self.turn is not None:
            attributes[CONVERSATION_ID] = self.turn.session_id
        if self.usage.prompt_tokens is not None:
            attributes[INPUT_TOKENS] = self.usage.prompt_tokens
            attributes[CACHE_READ_INPUT_TOKENS] = self.usage.cached_tokens or 0
        if self.usage.completion_tokens is not None:
            attributes[OUTPUT_TOKENS] = self.usage.completion_tokens
        return attributes


def outcome_of(turn: ChatTurn | None, error: BaseException | None) -> str:
    """`committed` (the reply completed and joined the session), the error that ended the request, or
    `incomplete` (an error response from vLLM, a client gone before the end)."""
    if error is not None:
        return type(error).__name__
    return "committed" if turn is not None and turn.committed else "incomplete"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
