"""Background model calls (condensed Codex renditions) are admitted like requests: within their tenant's
hourly budget, one at a time, and with their KV blocks reserved by the VRAM governor."""

from __future__ import annotations

import asyncio

import pytest

from core.errors import RateLimited
from orchestrator.context_spec import CodexDoc
from server.admission.hidden import HOUR_S, HiddenAdmission, TenantBudget
from server.admission.vram_governor import GovernorRejected, KVStats, VramGovernor
from server.codex.codex_condenser import PROMPT_OVERHEAD, CodexCondenser
from server.codex.codex_resolver import CodexResolver
from xdb import XDB

MODEL = "tiny"


def doc(i: int, words: int = 200) -> CodexDoc:
    return CodexDoc(id=f"d{i}", text=" ".join(f"fact{i}-{w}" for w in range(words)))


class SlowModel:
    """Stands in for the served model: each call takes a moment; the most calls in flight at once is kept."""

    def __init__(self) -> None:
        self.running = self.most = self.calls = 0

    async def __call__(self, messages: list[dict], max_tokens: int) -> str:
        self.running += 1
        self.calls += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.02)
        self.running -= 1
        return "short"


def condenser(xdb: XDB, model: SlowModel, admission: HiddenAdmission) -> CodexCondenser:
    return CodexCondenser(model, lambda text: len(text.split()), xdb, CodexResolver(xdb, MODEL), 0.3, 8192,
                          admission)


def governor(total_blocks: int = 10_000, used: int = 0) -> VramGovernor:
    stats = KVStats(total_blocks=total_blocks, block_size=16, usage=used / total_blocks)
    return VramGovernor(stats, queue_timeout_s=0.1, retry_after_s=1, poll_s=0.01)


def test_many_new_documents_are_condensed_one_at_a_time(xdb: XDB) -> None:
    model = SlowModel()
    made = condenser(xdb, model, HiddenAdmission(governor(), TenantBudget(10**9)))

    async def scenario() -> None:
        made.want(tuple(doc(i) for i in range(6)), "")
        await asyncio.gather(*list(made._running.values()))

    asyncio.run(scenario())
    assert model.calls == 6 and model.most == 1


def test_a_tenant_over_its_budget_is_refused_and_another_tenant_is_not(xdb: XDB) -> None:
    model = SlowModel()
    call = 200 + PROMPT_OVERHEAD + int(200 * 0.3)  # one rendition's prompt and completion tokens
    made = condenser(xdb, model, HiddenAdmission(governor(), TenantBudget(2 * call)))

    async def scenario() -> None:
        assert await made.condense(doc(1), "alice/") is not None
        assert await made.condense(doc(2), "alice/") is not None
        with pytest.raises(RateLimited) as refused:
            await made.condense(doc(3), "alice/")
        assert refused.value.code == "hidden_call_budget" and refused.value.retry_after_s > 3000
        assert await made.condense(doc(3), "bob/") is not None  # bob's budget is his own

    asyncio.run(scenario())
    assert model.calls == 3


def test_the_budget_is_a_rolling_hour() -> None:
    budget = TenantBudget(100)
    budget.take("a", 60, now=0.0)
    with pytest.raises(RateLimited):
        budget.take("a", 60, now=10.0)
    budget.take("a", 60, now=HOUR_S + 1)  # the first call has left the hour


def test_a_rendition_waits_for_kv_blocks_and_is_refused_without_calling_the_model(xdb: XDB) -> None:
    model = SlowModel()
    full = governor(total_blocks=100, used=95)  # 5 free; a 200-word rendition needs more
    made = condenser(xdb, model, HiddenAdmission(full, TenantBudget(10**9)))
    with pytest.raises(GovernorRejected):
        asyncio.run(made.condense(doc(1), ""))
    assert model.calls == 0 and full.free_blocks() == 5  # nothing stays reserved
