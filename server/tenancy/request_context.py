"""What the HTTP request that started a piece of work says about it, for code vLLM calls.

Set by AHC's middleware and chat route, read by `RecordingEngine.generate` when vLLM's handler calls
it: the handler runs in a task copied from the route's context, so the values travel without
threading them through vLLM's code.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends

from server.tenancy.tenants import LOCAL, Tenant


@dataclass
class EngineUsage:
    """A request as the engine saw it: its prompt's tokens and how many of them the prefix cache held, and
    what it generated."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    request_id: str | None = None  # the route's id for the engine request, which the reply's token rows carry
    model: str | None = None  # the model the engine ran it on: its served name, or the LoRA adapter's
    completion_tokens: int = 0  # generated so far, over every choice
    finish_reasons: dict[int, str] = field(default_factory=dict)  # the engine's, by choice index
    # Each choice's generated text, by choice index: kept only when traces record the conversation.
    texts: dict[int, list[str]] | None = None
    # With `texts`: the reply as its door settled it (tool calls parsed), once it has.
    reply: dict[str, Any] | None = None
    # Set by a route that makes the reply durable itself before the client sees it end (a JSON body, a
    # stream of one choice): the engine hands its last output on at once, its tokens queued, and the
    # route commits them with the turn's own rows (server/pipeline/turn_pipeline.py).
    route_holds_end: bool = False

    def saw(self, output: Any, delta: bool) -> None:
        """Read from each of the engine's outputs (a vLLM RequestOutput); `delta`: each output holds only
        what is new, not everything so far."""
        if self.prompt_tokens is None or output.finished:
            self.prompt_tokens = len(output.prompt_token_ids or ())
            self.cached_tokens = output.num_cached_tokens or 0
        for completion in output.outputs:
            if completion.finish_reason is not None:
                self.finish_reasons[completion.index] = completion.finish_reason
            if self.texts is not None:
                text = self.texts.setdefault(completion.index, [])
                if not delta:
                    text.clear()
                text.append(completion.text)


current_session: ContextVar[str | None] = ContextVar("ahc_current_session", default=None)
# Filled in by the engine's outputs for the chat route's log line and span.
current_usage: ContextVar[EngineUsage | None] = ContextVar("ahc_current_usage", default=None)
# The tenant of the request's key (the API key middleware sets it; without keys, the one local tenant).
current_tenant: ContextVar[Tenant] = ContextVar("ahc_current_tenant", default=LOCAL)


async def request_tenant() -> Tenant:
    """FastAPI dependency: the calling tenant (async: read on the request's task, no thread hop)."""
    return current_tenant.get()


# A route parameter of this type is the calling tenant.
Caller = Annotated[Tenant, Depends(request_tenant)]
