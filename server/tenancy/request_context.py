"""What the HTTP request that started a piece of work says about it, for code vLLM calls.

Set by AHC's middleware and chat route, read by `RecordingEngine.generate` when vLLM's handler calls
it: the handler runs in a task copied from the route's context, so the values travel without
threading them through vLLM's code.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends

from server.tenancy.tenants import LOCAL, Tenant


@dataclass
class EngineUsage:
    """A request's prompt as the engine saw it: its tokens and how many of them the prefix cache held."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    request_id: str | None = None  # the engine's id, which the reply's token rows carry
    completion_tokens: int = 0  # generated so far, over every choice
    # Set by a route that streams one choice and holds the end of its stream until the reply is
    # durable itself (the chat route): the engine then hands its last output on at once, and
    # `durable` is done once the reply's rows are committed.
    route_holds_end: bool = False
    durable: asyncio.Future[None] | None = None

    def saw(self, output: Any) -> None:
        """Read from one of the engine's outputs (a vLLM RequestOutput)."""
        self.prompt_tokens = len(output.prompt_token_ids or ())
        self.cached_tokens = output.num_cached_tokens or 0
        self.request_id = output.request_id


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
