"""Admission of the model calls the server makes in the background on a tenant's behalf.

A condensed Codex rendition is a model call of up to a whole window, started by any request that
brings a Codex document the server has not condensed yet. Unadmitted, a tenant sending many distinct
large documents would start as many calls at once, past the VRAM governor, and push the engine into
preemption for every tenant. So each such call:
- counts against its tenant's budget of tokens (prompt and completion) over the last hour; past it,
  the call is refused (429) and the request goes on without the rendition;
- runs one at a time per served model (the rest wait their turn);
- reserves its KV blocks with the VRAM governor, like a client's request: short of blocks it waits,
  then is refused.

Compaction summaries are not admitted here: each continues the cached prompt of a turn that is itself
admitted, one per turn, and holding it back would hold back the turn.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from core.errors import RateLimited
from server.admission.vram_governor import VramGovernor

HOUR_S = 3600.0


@dataclass
class TenantBudget:
    """Tokens each tenant's background calls may use over a rolling hour, by the tenant's owner string
    (xdb/owner.py)."""

    tokens_per_hour: int
    _spent: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)

    def take(self, owner: str, tokens: int, now: float | None = None) -> None:
        """Count `tokens` against `owner`'s tenant, or raise RateLimited (nothing counted) naming when there is room."""
        now = time.monotonic() if now is None else now
        spent = self._spent.setdefault(owner, deque())
        while spent and spent[0][0] <= now - HOUR_S:
            spent.popleft()
        used = sum(n for _, n in spent)
        if used + tokens > self.tokens_per_hour:
            wait = HOUR_S - (now - spent[0][0]) if spent else HOUR_S
            raise RateLimited(f"background model calls for this tenant have used {used:,} of their "
                              f"{self.tokens_per_hour:,} tokens this hour; this one needs {tokens:,}",
                              retry_after_s=max(1, round(wait)), code="hidden_call_budget")
        spent.append((now, tokens))


class HiddenAdmission:
    """Budget, then one at a time, then KV blocks: see the module's docstring."""

    def __init__(self, governor: VramGovernor, budget: TenantBudget) -> None:
        self.governor = governor
        self.budget = budget
        self._turn = asyncio.Lock()
        self.waiting = 0  # calls waiting for their turn (a gauge for tests and logs)

    @asynccontextmanager
    async def admitted(self, owner: str, prompt_tokens: int, max_tokens: int) -> AsyncIterator[None]:
        self.budget.take(owner, prompt_tokens + max_tokens)
        self.waiting += 1
        try:
            await self._turn.acquire()
        finally:
            self.waiting -= 1
        try:
            # No cache credit: a rendition's source is a document the cache has not seen in this form.
            reservation = await self.governor.admit(self.governor.blocks_needed(prompt_tokens, 0, max_tokens))
            try:
                yield
            finally:
                reservation.release()
        finally:
            self._turn.release()


@asynccontextmanager
async def admitted(admission: HiddenAdmission | None, owner: str, prompt_tokens: int,
                   max_tokens: int) -> AsyncIterator[None]:
    """`admission.admitted(...)`; with no admission (a unit test of one piece), nothing to pass."""
    if admission is None:
        yield
        return
    async with admission.admitted(owner, prompt_tokens, max_tokens):
        yield
