"""Stored responses as chains, on AHC's whole app (fake engine, TestClient, a real XDB), through the
official `openai` client: a continuation sees exactly the conversation up to the response it continues
(not a later `store: false` turn of the session, nor a sibling continuation running beside it), a
client that resends its history has it stored once (by reference, read back whole, also once the
response it references is deleted), and deleting a response says what it leaves."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, cast

import duckdb
import openai
from fake_app import ALICE
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from test_responses_route import client_for, prompt_of, scoped

from server.runtime import Runtime
from xdb import responses
from xdb.interface import reads
from xdb.schema import APP, MIGRATIONS, migrate


def fake_engine(runtime: Runtime) -> FakeEngine:
    return cast(FakeEngine, runtime.hidden.engine)


def engine_prompts(runtime: Runtime, last: int) -> list[str]:
    """The text of the last `last` prompts the engine was given, in the order it got them."""
    engine = fake_engine(runtime)
    tokenizer = engine.get_tokenizer()
    return [str(tokenizer.decode(r.prompt_token_ids)) for r in engine.requests[-last:]]


@reads
def query(cur: duckdb.DuckDBPyConnection, sql: str, args: list[Any]) -> list[tuple[Any, ...]]:
    return cur.execute(sql, args).fetchall()


def stored(runtime: Runtime, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    assert runtime.xdb.writer is not None
    runtime.xdb.writer.flush()
    return runtime.xdb.read(query, sql, list(args))


def test_a_continuation_does_not_see_a_later_store_false_turn_of_its_session(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = client_for(http)
    first = client.responses.with_raw_response.create(model="tiny", input="My name is Ada.", max_output_tokens=4)
    session, r1 = first.headers["X-Session-ID"], first.parse()
    r2 = client.responses.create(model="tiny", input="I like tea.", previous_response_id=r1.id, max_output_tokens=4)
    unstored = client.responses.with_raw_response.create(model="tiny", input="The code is 7.", store=False,
                                                          previous_response_id=r2.id, max_output_tokens=4)
    assert unstored.headers["X-Session-ID"] == session  # a turn of the State that holds r2's chain
    state = runtime.orchestrator.sessions.get(scoped(runtime, session)).messages
    assert [m.content for m in state if m.role == "user"] == ["My name is Ada.", "I like tea.", "The code is 7."]
    again = client.responses.with_raw_response.create(model="tiny", input="What did I say?",
                                                       previous_response_id=r2.id, max_output_tokens=4)
    prompt = prompt_of(runtime)
    assert prompt.count("My name is Ada.") == 1 and prompt.count("I like tea.") == 1
    assert "The code is 7." not in prompt and again.headers["X-Session-ID"] != session  # forked
    r3 = again.parse()
    # It continues as a chain of its own: the next turn sees r3's conversation, still without the code.
    client.responses.create(model="tiny", input="And then?", previous_response_id=r3.id, max_output_tokens=4)
    prompt = prompt_of(runtime)
    assert "What did I say?" in prompt and "The code is 7." not in prompt and prompt.count("I like tea.") == 1


def test_parallel_continuations_of_one_response_each_see_only_their_own_input(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = client_for(http)
    r1 = client.responses.create(model="tiny", input="Base fact.", max_output_tokens=4)
    r2 = client.responses.create(model="tiny", input="Second fact.", previous_response_id=r1.id, max_output_tokens=4)
    engine = fake_engine(runtime)
    engine.step_delay = 0.1  # each reply takes ~0.6 s: the second request arrives while the first runs
    sent = len(engine.requests)
    results: dict[str, str] = {}

    def continue_with(text: str) -> None:
        raw = client.responses.with_raw_response.create(model="tiny", input=text, previous_response_id=r2.id,
                                                         max_output_tokens=6)
        results[text] = raw.headers["X-Session-ID"]

    first = threading.Thread(target=continue_with, args=("Sibling A.",))
    first.start()
    deadline = time.monotonic() + 30
    while len(engine.requests) == sent and time.monotonic() < deadline:
        time.sleep(0.01)
    continue_with("Sibling B.")
    first.join()
    engine.step_delay = 0.0
    prompts = engine_prompts(runtime, 2)
    assert all("Base fact." in p and "Second fact." in p for p in prompts)
    assert ["Sibling A." in p for p in prompts] == [True, False]
    assert ["Sibling B." in p for p in prompts] == [False, True]
    assert results["Sibling A."] != results["Sibling B."]  # the second forked


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def resend(client: openai.OpenAI, turns: int, words: int) -> tuple[list[str], list[dict[str, Any]]]:
    """A client that resends its whole history each turn (Codex CLI's way): the ids of its responses and
    its history at the end."""
    history: list[dict[str, Any]] = []
    ids = []
    for turn in range(turns):
        history.append(user(f"Turn {turn}: " + "lorem ipsum " * words))
        response = client.responses.create(model="tiny", instructions="Be brief.", input=history,  # type: ignore[arg-type]
                                           max_output_tokens=4, prompt_cache_key="resent")
        ids.append(response.id)
        history.append({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": response.output_text}]})
    return ids, history


def stored_bytes(runtime: Runtime, ids: list[str]) -> list[int]:
    rows = dict(stored(runtime, "SELECT id, length(conversation_json) + length(response_json) FROM stored_responses "
                                "WHERE id IN (SELECT unnest(?))", ids))
    return [rows[i] for i in ids]


def test_a_resent_history_is_stored_once_and_read_back_whole(two_tenants: tuple[TestClient, Runtime]) -> None:
    """Each response stores what its turn added (its new input and its reply), not the history again: the
    bytes stored per turn stay flat while the history grows; each response's input and conversation
    read back exactly as sent."""
    http, runtime = two_tenants
    ids, history = resend(client_for(http), 10, words=20)
    sizes = stored_bytes(runtime, ids)
    new_per_turn = len(json.dumps(history[-2]))  # the last turn's input message
    # Flat in the turns (a row holds its turn's input and reply), not growing with the history.
    assert max(sizes[1:]) - min(sizes[1:]) < new_per_turn, sizes
    assert sum(sizes) < 3 * len(json.dumps(history)) + len(ids) * min(sizes), sizes
    for index, rid in enumerate(ids):
        conversation = runtime.xdb.read(responses.response_conversation, rid)
        assert len(conversation) == 2 * index + 2
        assert [m["content"] for m in conversation[::2]] == [h["content"] for h in history[:2 * index + 1:2]]
        assert runtime.xdb.read(responses.response_input, rid) == conversation[:-1]


def test_deleting_a_referenced_response_leaves_the_later_ones_whole_and_says_what_stays(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    http, runtime = two_tenants
    client = client_for(http)
    ids, _ = resend(client, 4, words=5)
    before = [runtime.xdb.read(responses.response_conversation, rid) for rid in ids]
    deleted = http.delete(f"/v1/responses/{ids[1]}", headers={"Authorization": f"Bearer {ALICE}"})
    assert deleted.status_code == 200, deleted.text
    body = deleted.json()
    assert body["id"] == ids[1] and body["deleted"] is True and body["session_id"] == "resent"
    assert "State" in body["note"] and "/v1/context/sessions/resent" in body["note"]
    assert [runtime.xdb.read(responses.response_conversation, rid) for rid in ids[2:]] == before[2:]
    assert runtime.xdb.read(responses.response_input, ids[3]) == before[3][:-1]
    assert stored(runtime, "SELECT count(*) FROM stored_responses WHERE id = ?", ids[1]) == [(0,)]
    client.responses.delete(ids[2])  # one referenced by one that referenced the deleted one
    assert runtime.xdb.read(responses.response_conversation, ids[3]) == before[3]


def test_responses_stored_before_the_references_still_read_after_the_migration(tmp_path: Path) -> None:
    path = tmp_path / "experience.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn, path, MIGRATIONS[:6], "xdb_meta", APP)  # a file from before the references
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    conn.execute("INSERT INTO stored_responses VALUES ('resp_1', 's1', NULL, true, ?, ?, now())",
                 [json.dumps(conversation), json.dumps({"id": "resp_1", "output": []})])
    migrate(conn, path, MIGRATIONS, "xdb_meta", APP)
    old = responses.stored_response(conn.cursor(), "resp_1")
    assert old is not None and old.kept and old.state_sha is None  # so a continuation of it forks
    assert responses.response_conversation(conn.cursor(), "resp_1") == conversation
    assert responses.response_input(conn.cursor(), "resp_1") == conversation[:1]
