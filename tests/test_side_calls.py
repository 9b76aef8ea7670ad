"""Side requests an agent sends under its session's id (a title, a summary, a quota check): carrying no
tools beside turns that carry the agent's, each is a side call of the session with its own turn record
and report, and neither becomes a turn nor breaks the next turn's report. On AHC's whole app (fake
engine, TestClient, a real XDB), through the chat door as an agent calls it."""

from __future__ import annotations

from typing import Any

from fake_app import ALICE
from fastapi.testclient import TestClient

from orchestrator.named_sessions import NamedSessions, tools_key
from server.runtime import Runtime
from xdb.owner import EVERY

AGENT = "You are a coding agent with tools. " * 20
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
HEADERS = {"Authorization": f"Bearer {ALICE}", "X-Session-ID": "agent-1"}


def ask(http: TestClient, messages: list[dict[str, Any]], tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "messages": messages}
    if tools:
        body["tools"] = TOOLS
    response = http.post("/v1/chat/completions", headers=HEADERS, json=body)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def title(http: TestClient, text: str) -> dict[str, Any]:
    return ask(http, [{"role": "system", "content": "You generate a short title."},
                      {"role": "user", "content": f"Generate a title for: {text}"}], tools=False)


def test_a_side_call_between_turns_neither_counts_nor_breaks_the_next_report(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    history: list[dict[str, Any]] = [{"role": "system", "content": AGENT}, {"role": "user", "content": "List files."}]
    first = ask(http, history)
    assert first["context"]["session_naming"] == "explicit"
    side = title(http, "List files.")
    assert side["context"]["session_naming"] == "side" and side["context"]["first_changed_block"] is None
    history += [first["choices"][0]["message"], {"role": "user", "content": "Open the README."}]
    second = ask(http, history)
    # against the first turn, not the side call: its identity is cached, the State grew
    assert second["context"]["session_naming"] == "explicit" and second["context"]["first_changed_block"] == "state"
    assert title(http, "Open the README.")["context"]["first_changed_block"] == "query"  # against the last side call
    runtime.xdb.writer.flush()
    turns = http.get("/v1/xdb/sessions/agent-1/turns", headers=HEADERS).json()["turns"]
    assert [(t["index"], t["side"]) for t in turns] == [(1, False), (None, True), (2, False), (None, True)]
    scoped = runtime.keys.tenant_for(ALICE).scope("agent-1")  # type: ignore[union-attr]
    rows = runtime.xdb.recall(session_id=scoped, event_types=["input"], owner=EVERY)
    inputs = [r["content"] for r in rows if r["role"] == "user"]
    assert inputs == ["List files.", "Open the README."]  # a side call's words are its record's, not the session's
    listed = http.get("/v1/context/sessions", headers=HEADERS).json()["data"]
    assert next(s for s in listed if s["session_id"] == "agent-1")["turns"] == 2


def test_a_side_call_sent_before_the_first_turn_reads_as_one_once_the_turns_come() -> None:
    named = NamedSessions(8)
    no_tools, tools = tools_key([]), tools_key(TOOLS)
    assert not named.side("s", no_tools, False, "sys")  # nothing known yet: the first request is a turn
    named.remember("s", {"identity": "a"}, no_tools)
    assert not named.side("s", tools, False, "sys")  # the agent's first turn takes over as the session's tools
    assert named.last_hashes("s", tools) is None  # and is not reported against the title request
    named.remember("s", {"identity": "b"}, tools)
    assert named.last_hashes("s", tools) == {"identity": "b"}


def test_what_makes_a_side_call() -> None:
    named = NamedSessions(8)
    no_tools, tools = tools_key([]), tools_key(TOOLS)
    other = tools_key([{"type": "function", "function": {"name": "grep"}}])
    named.remember("plain", {"identity": "chat"}, no_tools)
    assert named.side("plain", no_tools, False, "title")  # a title call beside a chat without tools
    assert not named.side("plain", no_tools, True, "title")
    assert not named.side("plain", no_tools, False, "chat")  # a turn laid out anew under the same system prompt
    named.remember("agent", {"identity": "agent"}, tools)
    assert named.side("agent", no_tools, True, "agent")  # a summary call resends the history, without tools
    assert not named.side("agent", tools, False, "agent")  # the agent's own tools: a history compacted
    assert named.side("agent", other, False, "sub")  # a sub-agent's conversation
    assert not named.side("agent", other, True, "agent")  # a tool added to the agent's conversation


def test_a_title_call_beside_a_chat_without_tools_is_a_side_call(two_tenants: tuple[TestClient, Runtime]) -> None:
    http, _ = two_tenants
    history: list[dict[str, Any]] = [{"role": "system", "content": "You explain automata."},
                                     {"role": "user", "content": "What is rule 110?"}]
    first = ask(http, history, tools=False)
    assert title(http, "What is rule 110?")["context"]["session_naming"] == "side"
    history += [first["choices"][0]["message"], {"role": "user", "content": "And rule 30?"}]
    second = ask(http, history, tools=False)
    assert second["context"]["session_naming"] == "explicit" and second["context"]["first_changed_block"] == "state"


def test_a_turn_laid_out_anew_under_the_same_system_prompt_is_a_turn(two_tenants: tuple[TestClient, Runtime]) -> None:
    """Aider puts the history before the files each turn: no turn extends the last, all are turns."""
    http, _ = two_tenants
    system = {"role": "system", "content": "Act as an expert software developer."}
    first = ask(http, [system, {"role": "user", "content": "main.py:\nprint(1)"},
                       {"role": "user", "content": "What does it print?"}], tools=False)
    second = ask(http, [system, {"role": "user", "content": "What does it print?"}, first["choices"][0]["message"],
                        {"role": "user", "content": "main.py:\nprint(1)"},
                        {"role": "user", "content": "Explain it."}], tools=False)
    assert second["context"]["session_naming"] == "explicit"
