"""The session of the HTTP request that started a generation, for the recording engine.

Set by the chat route, read by `RecordingEngine.generate` when vLLM's handler calls it: the handler
runs in a task copied from the route's context, so the value travels without threading it through
vLLM's code.
"""

from __future__ import annotations

from contextvars import ContextVar

current_session: ContextVar[str | None] = ContextVar("ahc_current_session", default=None)
