"""Sessions named without asking: a client that names none and resends its growing history stays in one
session; conversations side by side stay apart; an edited history starts a new session and leaves the
first as it was. On AHC's whole app (fake engine, TestClient, a real XDB), through both chat doors."""

from __future__ import annotations

import anthropic
from fake_app import ALICE, BOB
from fastapi.testclient import TestClient

from orchestrator.conversations import Conversations, chain, extend
from server.runtime import Runtime
from xdb.owner import EVERY


class ChatClient:
    """An ordinary chat client: no session id, its whole history resent each turn."""

    def __init__(self, http: TestClient, key: str = ALICE) -> None:
        self.http, self.key = http, key
        self.history: list[dict[str, object]] = [{"role": "system", "content": "You are terse."}]

    def ask(self, question: str) -> tuple[str, dict[str, object]]:
        """The session the reply came in and its cache report."""
        self.history.append({"role": "user", "content": question})
        response = self.http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {self.key}"},
                                  json={"model": "tiny", "max_tokens": 6, "messages": self.history})
        assert response.status_code == 200, response.text
        self.history.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
        return response.headers["X-Session-ID"], response.json()["context"]


def inputs(runtime: Runtime, key: str, session: str) -> list[str]:
    runtime.xdb.writer.flush()
    scoped = runtime.keys.tenant_for(key).scope(session)  # type: ignore[union-attr]
    rows = runtime.xdb.recall(session_id=scoped, event_types=["input"], owner=EVERY)
    return [r["content"] for r in rows if r["role"] == "user"]


def test_a_resent_growing_history_is_one_session(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = ChatClient(http)
    sessions, namings = zip(*[(s, report["session_naming"]) for s, report in
                              (client.ask(q) for q in ("First?", "Second?", "Third?"))])
    assert len(set(sessions)) == 1 and namings == ("new", "inferred", "inferred")
    assert inputs(runtime, ALICE, sessions[0]) == ["First?", "Second?", "Third?"]
    records = runtime.xdb.recall(session_id=runtime.keys.tenant_for(ALICE).scope(sessions[0]),  # type: ignore[union-attr]
                                 event_types=["system"], owner=EVERY)
    named = [r["metadata"]["turn"]["session_naming"] for r in records if "turn" in (r["metadata"] or {})]
    assert named == list(namings)


def test_interleaved_conversations_stay_two_and_tenants_never_meet(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    a, b, bob = ChatClient(http), ChatClient(http), ChatClient(http, BOB)
    a.history[0]["content"] = "You study cells."
    firsts = [a.ask("Hello"), b.ask("Hello"), bob.ask("Hello")]
    seconds = [a.ask("Go on"), b.ask("Go on"), bob.ask("Go on")]
    assert [s for s, _ in firsts] == [s for s, _ in seconds]
    assert len({s for s, _ in firsts}) == 3
    assert firsts[1][1]["session_naming"] == "new"  # b's history is a's only in its user line, not its system
    assert firsts[2][1]["session_naming"] == "new"  # bob sent b's very messages: another tenant's never match
    assert inputs(runtime, ALICE, firsts[0][0]) == ["Hello", "Go on"]


def test_an_edited_history_starts_a_new_session_and_leaves_the_first_whole(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = ChatClient(http)
    first, _ = client.ask("Which cells move?")
    assert client.ask("And then?")[0] == first
    client.history[1]["content"] = "Which cells stay?"  # the client edits its first question and resends
    edited, report = client.ask("And then?")
    assert edited != first and report["session_naming"] == "new"
    assert inputs(runtime, ALICE, first) == ["Which cells move?", "And then?"]
    # resending an earlier state of the first conversation (a retry of its second turn) forks as well
    retry = ChatClient(http)
    retry.history = client.history[:1] + [{"role": "user", "content": "Which cells move?"}]
    assert retry.ask("And then?")[0] not in (first, edited)


def test_a_messages_client_resending_its_history_is_one_session(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = anthropic.Anthropic(base_url="http://testserver", api_key=ALICE, http_client=http, max_retries=0)
    history: list[dict[str, object]] = []
    sessions = []
    for question in ("One?", "Two?"):
        history.append({"role": "user", "content": question})
        raw = client.messages.with_raw_response.create(model="tiny", max_tokens=6, messages=history)  # type: ignore[arg-type]
        reply = raw.parse()
        history.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        sessions.append(raw.headers["X-Session-ID"])
    assert sessions[0] == sessions[1]
    assert inputs(runtime, ALICE, sessions[0]) == ["One?", "Two?"]


def test_a_resent_tool_call_matches_whatever_its_spacing_and_ids() -> None:
    sent = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": '{"city":  "Paris"}'}}]}]
    resent = [{"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "toolu_9", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}]},
              {"role": "tool", "tool_call_id": "toolu_9", "content": "sunny"}]
    conversations = Conversations(8)
    conversations.advance("s1", head("", sent))
    assert conversations.find(chain("", resent)) == ("s1", 2)  # the two messages sent and answered
    assert conversations.find(chain("tenant:b/", resent)) is None
    assert chain("", sent)[0] == chain("", resent)[0]
    # a reply extends a request's last head into the head of the messages resent with it
    assert extend(chain("", sent[:1])[-1], sent[1]) == head("", resent[:2])


def test_only_the_latest_head_continues_and_the_index_is_bounded() -> None:
    conversations = Conversations(2)
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    later = [*first, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    conversations.advance("s1", head("", first))
    conversations.advance("s1", head("", later))
    assert conversations.find(chain("", [*first, {"role": "user", "content": "x"}])) is None  # an earlier state: a fork
    conversations.advance("s2", head("", [{"role": "user", "content": "e"}]))
    conversations.advance("s3", head("", [{"role": "user", "content": "f"}]))
    assert conversations.find(chain("", [{"role": "user", "content": "e"}, {"role": "user", "content": "g"}])) \
        == ("s2", 1)
    # s1, least recently used, dropped
    assert conversations.find(chain("", [*later, {"role": "user", "content": "h"}])) is None


def head(tenant_prefix: str, messages: list[dict[str, object]]) -> str:
    return chain(tenant_prefix, messages)[-1]
