"""Conversations inferred from resent histories are kept per tenant: another tenant's one-off requests
never push a tenant's conversation out of the table (which would split its session in two), and the
tables together stay bounded. Over AHC's whole app (fake engine, TestClient, a real XDB) with the
table's capacity shrunk, and on the table itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_app import ALICE, BOB, serving
from fastapi.testclient import TestClient
from test_session_inference import ChatClient
from vllm.config import VllmConfig

from core.config import AHCConfig
from orchestrator.conversations import Conversations, chain, extend
from server.runtime import Runtime


@pytest.fixture
def two_tenants_two_conversations(config: AHCConfig, vllm_config: VllmConfig,
                                  tmp_path: Path) -> Iterator[tuple[TestClient, Runtime]]:
    shrunk = config.with_overrides(**{"orchestrator.max_sessions": 2})  # each tenant's table holds two
    with serving(shrunk, vllm_config, tmp_path, api_key=[ALICE, BOB]) as served:
        yield served


def test_another_tenants_one_off_requests_leave_a_conversation_whole(
        two_tenants_two_conversations: tuple[TestClient, Runtime]) -> None:
    http, _ = two_tenants_two_conversations
    alice = ChatClient(http)
    first, _ = alice.ask("First?")
    for n in range(3):  # more than the table holds
        ChatClient(http, BOB).ask(f"One-off {n}?")
    second, report = alice.ask("Second?")
    assert second == first and report["session_naming"] == "inferred"


def head(tenant: str, text: str) -> str:
    message = {"role": "user", "content": text}
    return extend(chain(tenant, [message])[-1], {"role": "assistant", "content": "ok"})


def asked(tenant: str, text: str) -> list[str]:
    return chain(tenant, [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"},
                          {"role": "user", "content": "more"}])


def test_each_tenant_keeps_its_own_capacity_and_the_tables_are_bounded() -> None:
    conversations = Conversations(2, max_tenants=2)
    conversations.advance("a1", head("a/", "x"), tenant="a/")
    for n in range(5):
        conversations.advance(f"b{n}", head("b/", str(n)), tenant="b/")
    assert [conversations.find(asked("b/", str(n)), "b/") is not None for n in range(5)] == [False] * 3 + [True] * 2
    assert conversations.find(asked("a/", "x"), "a/") == ("a1", 2)  # b's five never pushed a's one out
    conversations.advance("c1", head("c/", "x"), tenant="c/")  # a third tenant: b's table, least recently used, goes
    assert conversations.find(asked("b/", "4"), "b/") is None
    assert conversations.find(asked("a/", "x"), "a/") == ("a1", 2)
    assert conversations.find(asked("c/", "x"), "c/") == ("c1", 2)
