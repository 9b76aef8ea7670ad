"""The conversations table shared by several API processes behaves exactly as the one in a process's
memory: every scenario runs against both (and a long random sequence of calls compares them step by
step), then real processes share one file: a conversation continued in one process is continued in
another, concurrent writers lose nothing, and capacity holds across them."""

from __future__ import annotations

import multiprocessing
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.conversations import Conversations, chain, extend
from orchestrator.shared_conversations import ConversationTable, SharedConversations

Factory = Callable[..., Any]


@pytest.fixture(params=["memory", "shared"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """A table of either kind: `make(capacity, max_tenants=...)`."""
    if request.param == "memory":
        return Conversations
    tables: list[SharedConversations] = []

    def shared(capacity: int, max_tenants: int = 64) -> SharedConversations:
        table = SharedConversations(tmp_path / f"conversations{len(tables)}.db", capacity, max_tenants)
        tables.append(table)
        return table

    def close() -> None:
        for table in tables:
            table.close()

    request.addfinalizer(close)
    return shared


def messages(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user" if n % 2 == 0 else "assistant", "content": text} for n, text in enumerate(texts)]


def replied(tenant: str, sent: list[dict[str, Any]], reply: str = "ok") -> tuple[str, str]:
    """The head after `sent` and its reply, and the head `sent` asked with (what `advance` takes)."""
    asked = chain(tenant, sent)[-1]
    return extend(asked, {"role": "assistant", "content": reply}), asked


def test_a_resent_history_continues_its_session_and_only_its_tenants(make: Factory) -> None:
    conversations: ConversationTable = make(8)
    sent: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": '{"city":  "Paris"}'}}]}]
    resent: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_9", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_9", "content": "sunny"}]
    conversations.advance("s1", extend(chain("", sent[:1])[-1], sent[1]), chain("", sent[:1])[-1])
    assert conversations.find(chain("", resent)) == ("s1", 2)
    assert conversations.find(chain("tenant:b/", resent)) is None
    assert conversations.find(chain("tenant:b/", resent), "tenant:b/") is None
    assert conversations.find([]) is None


def test_only_the_latest_head_continues_and_the_least_recently_used_goes(make: Factory) -> None:
    conversations: ConversationTable = make(2)
    first, later = messages("a", "b"), messages("a", "b", "c", "d")
    conversations.advance("s1", chain("", first)[-1])
    conversations.advance("s1", chain("", later)[-1])
    assert conversations.find(chain("", [*first, {"role": "user", "content": "x"}])) is None  # an earlier state: a fork
    conversations.advance("s2", chain("", messages("e"))[-1])
    conversations.advance("s3", chain("", messages("f"))[-1])
    assert conversations.find(chain("", messages("e", "g"))) == ("s2", 1)
    assert conversations.find(chain("", [*later, {"role": "user", "content": "h"}])) is None  # s1 dropped
    conversations.advance("s4", chain("", messages("i"))[-1])  # s3, not s2 (just found), goes
    assert conversations.find(chain("", messages("e", "g"))) == ("s2", 1)
    assert conversations.find(chain("", messages("f", "g"))) is None
    assert conversations.find(chain("", messages("i", "g"))) == ("s4", 1)


def test_the_longest_matching_head_wins_wherever_it_lies(make: Factory) -> None:
    conversations: ConversationTable = make(16)
    history = messages(*(f"m{n}" for n in range(1200)))
    heads = chain("t/", history)
    for session, index in [("short", 10), ("middle", 700), ("long", 1100)]:
        conversations.advance(session, heads[index], tenant="t/")
    assert conversations.find(heads, "t/") == ("long", 1101)
    assert conversations.find(heads[:1000], "t/") == ("middle", 701)
    assert conversations.find(heads[:600], "t/") == ("short", 11)
    assert conversations.find(heads[:10], "t/") is None
    conversations.advance("end", heads[1196], tenant="t/")  # among the last few: the first lookup's
    assert conversations.find(heads, "t/") == ("end", 1197)


def test_a_session_ending_on_another_sessions_head_takes_it(make: Factory) -> None:
    conversations: ConversationTable = make(8)
    head, asked = replied("", messages("same"))
    conversations.advance("s1", head, asked)
    conversations.advance("s2", head, asked)
    request = chain("", [*messages("same", "ok"), {"role": "user", "content": "next"}])
    assert conversations.find(request) == ("s2", 2)
    assert conversations.seen("s2", request) == 2
    assert conversations.seen("s1", request) == 1  # its head gone, its last request's still counts
    conversations.advance("s1", chain("", messages("other"))[-1])  # s1 on again: s2 keeps the shared head
    assert conversations.find(request) == ("s2", 2)


def test_seen_counts_the_latest_head_then_the_last_requests(make: Factory) -> None:
    conversations: ConversationTable = make(8)
    sent = messages("q1", "a1", "q2")
    head, asked = replied("t/", sent, "a2")
    conversations.advance("named", head, asked, tenant="t/")
    assert conversations.seen("named", chain("t/", [*sent, {"role": "assistant", "content": "a2"},
                                                   {"role": "user", "content": "q3"}]), "t/") == 4
    # a client that gives back another reply than the model's: the request's messages are still seen
    assert conversations.seen("named", chain("t/", [*sent, {"role": "assistant", "content": "mine"}]), "t/") == 3
    assert conversations.seen("named", chain("t/", messages("other")), "t/") is None
    assert conversations.seen("unknown", chain("t/", sent), "t/") is None
    assert conversations.seen("named", chain("t/", sent), "u/") is None
    conversations.advance("named", extend(head, {"role": "user", "content": "q3"}), tenant="t/")  # asked kept
    assert conversations.seen("named", chain("t/", [*sent, {"role": "assistant", "content": "x"}]), "t/") == 3


def test_each_tenant_keeps_its_own_capacity_and_the_tables_are_bounded(make: Factory) -> None:
    conversations: ConversationTable = make(2, max_tenants=2)

    def head(tenant: str, text: str) -> str:
        return replied(tenant, messages(text))[0]

    def asked(tenant: str, text: str) -> list[str]:
        return chain(tenant, messages(text, "ok", "more"))

    conversations.advance("a1", head("a/", "x"), tenant="a/")
    for n in range(5):
        conversations.advance(f"b{n}", head("b/", str(n)), tenant="b/")
    assert [conversations.find(asked("b/", str(n)), "b/") is not None for n in range(5)] == [False] * 3 + [True] * 2
    assert conversations.find(asked("a/", "x"), "a/") == ("a1", 2)
    conversations.advance("c1", head("c/", "x"), tenant="c/")  # b's table, least recently used, goes
    assert conversations.find(asked("b/", "4"), "b/") is None
    assert conversations.find(asked("a/", "x"), "a/") == ("a1", 2)
    assert conversations.find(asked("c/", "x"), "c/") == ("c1", 2)
    assert conversations.find(asked("a/", "nothing"), "a/") is None  # a miss still counts a's use
    conversations.advance("d1", head("d/", "x"), tenant="d/")  # so c's goes
    assert conversations.find(asked("a/", "x"), "a/") == ("a1", 2)
    assert conversations.find(asked("c/", "x"), "c/") is None


def test_a_long_random_sequence_of_calls_answers_alike(tmp_path: Path) -> None:
    rng = random.Random(7)
    memory = Conversations(5, max_tenants=3)
    shared = SharedConversations(tmp_path / "c.db", 5, max_tenants=3)
    pool, sessions, tenants = [f"h{n}" for n in range(14)], [f"s{n}" for n in range(9)], ["", "a/", "b/", "c/"]
    try:
        for step in range(4000):
            tenant, op = rng.choice(tenants), rng.random()
            if op < 0.45:
                args = (rng.choice(sessions), rng.choice(pool), rng.choice([None, rng.choice(pool)]), tenant)
                memory.advance(*args)
                shared.advance(*args)
            else:
                heads = [rng.choice(pool) for _ in range(rng.randrange(0, 12))]
                if op < 0.8:
                    assert shared.find(heads, tenant) == memory.find(heads, tenant), step
                else:
                    session = rng.choice(sessions)
                    assert shared.seen(session, heads, tenant) == memory.seen(session, heads, tenant), step
    finally:
        shared.close()


def test_two_tables_share_a_file_apart(tmp_path: Path) -> None:
    inferred = SharedConversations(tmp_path / "c.db", 4)
    named = SharedConversations(tmp_path / "c.db", 4, name="named")
    try:
        inferred.advance("s1", "h1")
        assert named.find(["h1"]) is None and inferred.find(["h1"]) == ("s1", 1)
    finally:
        inferred.close()
        named.close()
    with pytest.raises(ValueError):
        SharedConversations(tmp_path / "c.db", 4, name="x; DROP")


# Processes sharing one file. Targets are module-level: spawned processes import them.

def _advance(path: str, session: str, head: str, asked: str | None, capacity: int = 64) -> None:
    table = SharedConversations(path, capacity)
    table.advance(session, head, asked)
    table.close()


def _continue(path: str, request: list[str], head: str, found: Any) -> None:
    """Finds the session `request` continues, reports it, and advances it to `head`."""
    table = SharedConversations(path, 64)
    session = table.find(request)
    found.put(session)
    if session is not None:
        table.advance(session[0], head, request[-1])
    table.close()


def _advance_many(path: str, prefix: str, count: int, start: Any) -> None:
    start.wait()  # all open the new file at once, then write at once
    table = SharedConversations(path, 100_000)
    for n in range(count):
        table.advance(f"{prefix}{n % 50}", f"{prefix}-head-{n}", f"{prefix}-asked-{n}")
    table.close()


def _run(target: Callable[..., None], *args: Any) -> None:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join(60)
    assert process.exitcode == 0


@pytest.mark.process
def test_a_conversation_goes_on_in_whichever_process_gets_it(tmp_path: Path) -> None:
    path = str(tmp_path / "c.db")
    a = SharedConversations(path, 64)
    history = messages("q1")
    head1, asked1 = replied("", history, "a1")
    a.advance("s1", head1, asked1)
    history += messages("q1", "a1", "q2")[1:]
    head2, _ = replied("", history, "a2")
    found = multiprocessing.get_context("spawn").Queue()
    _run(_continue, path, chain("", history), head2, found)  # process B
    assert found.get(timeout=5) == ("s1", 2)
    resent = chain("", [*history, {"role": "assistant", "content": "a2"}, {"role": "user", "content": "q3"}])
    assert a.find(resent) == ("s1", 4)  # B's head
    assert a.find(chain("", [*history[:2], {"role": "user", "content": "q2 edited"}])) is None  # not A's older one
    a.close()


@pytest.mark.process
def test_processes_advancing_at_once_lose_nothing(tmp_path: Path) -> None:
    path, count, prefixes = str(tmp_path / "c.db"), 300, "abcd"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(len(prefixes))
    processes = [context.Process(target=_advance_many, args=(path, prefix, count, start)) for prefix in prefixes]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    table = SharedConversations(path, 100_000)
    for prefix in prefixes:
        for n in range(count - 50, count):  # each session's latest head
            assert table.find([f"{prefix}-head-{n}"]) == (f"{prefix}{n % 50}", 1)
            assert table.seen(f"{prefix}{n % 50}", [f"{prefix}-asked-{n}"]) == 1
        assert table.find([f"{prefix}-head-{count - 51}"]) is None  # superseded
    table.close()


def test_opening_a_file_another_process_is_writing_waits_for_it(tmp_path: Path) -> None:
    """Switching a file to WAL fails at once, busy timeout or not, while another connection holds its
    write lock (processes opening a new file at once): opening waits instead."""
    path = tmp_path / "c.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE other (a)")
    release = threading.Timer(0.2, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    table = SharedConversations(path, 4)
    assert time.monotonic() - started >= 0.15
    table.advance("s1", "h1")
    assert table.find(["h1"]) == ("s1", 1)
    table.close()
    release.join()
    holder.close()


@pytest.mark.process
def test_capacity_holds_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "c.db")
    a = SharedConversations(path, 3)
    for n in range(3):
        a.advance(f"s{n}", f"h{n}")
    assert a.find(["h0"]) == ("s0", 1)  # s0 now the most recently used: s1 goes first
    _run(_advance, path, "s3", "h3", None, 3)
    _run(_advance, path, "s4", "h4", None, 3)
    assert [a.find([f"h{n}"]) is not None for n in range(5)] == [True, False, False, True, True]
    a.close()


@pytest.mark.process
def test_a_forked_child_uses_a_connection_of_its_own(tmp_path: Path) -> None:
    table = SharedConversations(tmp_path / "c.db", 8)
    table.advance("parent", "h1")
    child = multiprocessing.get_context("fork").Process(target=table.advance, args=("child", "h2"))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert table.find(["h1"]) == ("parent", 1) and table.find(["h2"]) == ("child", 1)
    table.close()
