"""What the engine wrapper needs to know about the HTTP request that started a generation.

Set by the chat route, read by the recording engine when vLLM's handler calls `generate`: the handler
runs in a task copied from the route's context, so the value travels without threading it through
vLLM's code.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestRecord:
    session_id: str
    prepared: Any = None  # orchestrator.Prepared, when the chat route prepared the request


current_record: ContextVar[RequestRecord | None] = ContextVar("ahc_current_record", default=None)
