"""What the HTTP request that started a piece of work says about it, for code vLLM calls.

Set by AHC's middleware and chat route, read by `RecordingEngine.generate` when vLLM's handler calls
it: the handler runs in a task copied from the route's context, so the values travel without
threading them through vLLM's code.
"""

from __future__ import annotations

from contextvars import ContextVar

from server.tenants import LOCAL, Tenant

current_session: ContextVar[str | None] = ContextVar("ahc_current_session", default=None)
# The tenant of the request's key (the API key middleware sets it; without keys, the one local tenant).
current_tenant: ContextVar[Tenant] = ContextVar("ahc_current_tenant", default=LOCAL)


async def request_tenant() -> Tenant:
    """FastAPI dependency: the calling tenant (async: read on the request's task, no thread hop)."""
    return current_tenant.get()
