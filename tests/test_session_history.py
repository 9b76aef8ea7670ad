"""Session history: stored State versions, rollback, deletion, listing, and snapshots whose SHA-256 no
longer matches — in XDB, over HTTP on the fake engine's app, and from `ahc xdb`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import cli_runner
import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from core.errors import Conflict, NotFound
from server.runtime import Runtime
from xdb import XDB, TimestepRow
from xdb.owner import EVERY
from xdb.session_state import list_sessions, state_versions


def state(n: int) -> str:
    return json.dumps({"session_id": "s", "messages": [{"role": "user", "content": f"message {i}"} for i in range(n)]})


def corrupt(xdb: XDB, session: str, version: int) -> None:
    xdb.conn.execute("UPDATE session_states SET state_json = state_json || ' ' WHERE session_id = ? AND version = ?",
                     [session, version])


def test_versions_rollback_and_a_corrupted_snapshot(xdb: XDB) -> None:
    for n in (1, 2, 3):
        assert xdb.save_session_state("s", state(n)) == n
    assert [(v["version"], v["intact"]) for v in xdb.read(state_versions, "s")] == [(1, True), (2, True), (3, True)]
    restored = xdb.rollback_session("s", 1)
    assert restored == {"session_id": "s", "version": 4, "restored_from": 1}
    assert xdb.load_session_state("s") == state(1)
    corrupt(xdb, "s", 4)
    assert xdb.load_session_state_verified("s") == (state(3), [4])  # the newest intact one, and what was skipped
    assert [v["intact"] for v in xdb.read(state_versions, "s")] == [True, True, True, False]
    with pytest.raises(Conflict, match="corrupted"):
        xdb.rollback_session("s", 4)
    with pytest.raises(NotFound):
        xdb.rollback_session("s", 9)
    with pytest.raises(NotFound):
        xdb.read(state_versions, "nobody")


def test_sessions_list_by_prefix_and_page(xdb: XDB) -> None:
    for sid in ("a/1", "a/2", "b/1"):
        xdb.save_session_state(sid, state(1))
    xdb.writer.submit([TimestepRow("a/3", t, "output", content="x") for t in xdb.next_ticks("a/3", 2)])
    xdb.writer.flush()
    page = xdb.read(list_sessions, "a/", limit=2)
    assert [s["session_id"] for s in page] == ["a/1", "a/2"] and page[0]["latest_version"] == 1
    rest = xdb.read(list_sessions, "a/", after="a/2")
    assert rest == [{"session_id": "a/3", "last_tick": 1, "latest_version": None, "versions": 0, "updated_at": None,
                     "turns": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "last_turn_at": None}]


def test_deleting_a_session_removes_every_row_and_is_audited(xdb: XDB) -> None:
    xdb.writer.submit([TimestepRow("gone", t, "output", content="x") for t in xdb.next_ticks("gone", 5)])
    xdb.writer.flush()
    xdb.save_session_state("gone", state(2))
    xdb.tag("t", session_id="gone", tick=1, owner=EVERY)
    rows = xdb.delete_session("gone")
    assert (rows["timesteps"], rows["session_states"], rows["tag_applications"]) == (5, 1, 1)
    assert xdb.recall({"session_id": "gone"}, owner=EVERY) == [] and xdb.load_session_state("gone") is None
    with pytest.raises(NotFound):
        xdb.delete_session("gone")
    assert xdb.verify_audit().ok


def turn(client: TestClient, session: str, question: str) -> dict:
    reply = client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": question}],
        "context": {"session_id": session, "identity": "You are a careful physicist."}})
    assert reply.status_code == 200, reply.text
    return reply.json()


def settle(runtime: Runtime) -> None:
    runtime.background.submit(lambda: None).result()  # the ordered State saves have landed


def test_a_session_rolls_back_over_http_and_its_next_turn_continues_from_there(
        served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    for q in ("first?", "second?", "third?"):
        turn(client, "h1", q)
    settle(runtime)
    versions = client.get("/v1/context/sessions/h1/versions").json()
    assert [v["version"] for v in versions["data"]] == [1, 2, 3] and all(v["intact"] for v in versions["data"])
    rolled = client.post("/v1/context/sessions/h1/rollback", json={"version": 1})
    assert rolled.json() == {"session_id": "h1", "version": 4, "restored_from": 1}
    report = turn(client, "h1", "again?")["context"]
    assert report["first_changed_block"] == "state"
    state = runtime.orchestrator.sessions.get("h1").messages
    assert [m.content for m in state if m.role == "user"][:2] == ["first?", "again?"]
    runtime.xdb.writer.flush()
    listed = client.get("/v1/context/sessions").json()
    assert "h1" in [s["session_id"] for s in listed["data"]] and listed["has_more"] is False
    h1 = next(s for s in listed["data"] if s["session_id"] == "h1")
    assert h1["turns"] == 4 and h1["prompt_tokens"] > 0 and h1["completion_tokens"] > 0 and h1["last_turn_at"]
    bad = client.post("/v1/context/sessions/h1/rollback", json={"version": "1"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "version"
    assert client.post("/v1/context/sessions/nobody/rollback", json={"version": 1}).status_code == 404


def test_a_session_deleted_over_http_starts_afresh(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    turn(client, "d1", "remember this?")
    settle(runtime)
    gone = client.delete("/v1/context/sessions/d1")
    assert gone.status_code == 200, gone.text
    body = gone.json()
    assert body["object"] == "session.deleted" and body["deleted"] and body["rows"]["timesteps"] > 0
    assert runtime.xdb.recall({"session_id": "d1"}, owner=EVERY) == []
    turn(client, "d1", "new start?")
    assert [t.content for t in runtime.orchestrator.sessions.get("d1").messages][0] == "new start?"
    assert client.delete("/v1/context/sessions/never").status_code == 404


def test_a_session_says_where_it_stands_in_its_window(served: tuple[TestClient, Runtime]) -> None:
    """What a coding agent's `/context` shows, as JSON: tokens per block, the window, the mode, the
    cached share of the last prompt, turns and compactions."""
    client, runtime = served
    replies = [turn(client, "w1", q) for q in ("first?", "second?")]
    deadline = time.monotonic() + 5  # the turn records are committed within a second of the reply
    while (found := client.get("/v1/context/sessions/w1").json()).get("turns", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    last = replies[-1]
    assert found["object"] == "context.session" and found["session_id"] == "w1" and found["turns"] == 2
    assert found["window"] == runtime.config.engine.max_model_len
    assert found["mode"] == last["context"]["mode"]
    assert found["blocks"] == {b["name"]: b["tokens"] for b in last["context"]["blocks"]}
    assert found["blocks"]["identity"] > 0 and list(found["blocks"])[0] == "identity"
    assert found["prompt_tokens"] == last["usage"]["prompt_tokens"]
    assert found["cached_share"] == pytest.approx(last["usage"]["prompt_tokens_details"]["cached_tokens"]
                                                  / last["usage"]["prompt_tokens"])
    assert 0 < found["window_share"] < 1 and found["compactions"] == 0
    missing = client.get("/v1/context/sessions/nobody")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_a_client_asks_for_a_compaction_and_the_next_turn_makes_it(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    for n in range(6):  # more turns than compaction keeps verbatim (4)
        turn(client, "c1", f"question {n}?")
    asked = client.post("/v1/context/sessions/c1/compact")
    assert asked.status_code == 202, asked.text
    assert asked.json() == {"object": "context.compaction", "session_id": "c1", "status": "pending", "turns": 12}
    settle(runtime)
    assert runtime.orchestrator.sessions.get("c1").compaction_requested  # stored with the State
    report = turn(client, "c1", "and now?")["context"]
    assert "compaction" in report["governor"]
    session = runtime.orchestrator.sessions.get("c1")
    assert session.compactions == 1 and not session.compaction_requested and session.summary
    assert len(session.messages) < 12
    assert client.post("/v1/context/sessions/nobody/compact").status_code == 404


def test_a_corrupted_snapshot_loads_the_previous_one_and_is_counted(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    turn(client, "c1", "one?")
    turn(client, "c1", "two?")
    settle(runtime)
    xdb = runtime.xdb
    assert isinstance(xdb, XDB)
    corrupt(xdb, "c1", 2)
    runtime.orchestrator.sessions.forget("c1")
    turn(client, "c1", "three?")
    users = [t.content for t in runtime.orchestrator.sessions.get("c1").messages if t.role == "user"]
    assert users == ["one?", "three?"]
    assert "ahc_session_states_corrupt_total" in generate_latest(runtime.metrics.registry).decode()
    assert runtime.metrics.one(runtime.metrics.corrupt_session_states)._value.get() == 1


def test_the_cli_lists_rolls_back_and_deletes(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "d") as xdb:
        for n in (1, 2):
            xdb.save_session_state("s", state(n))

    def ahc(*args: str) -> subprocess.CompletedProcess[str]:
        # In this process (cli_runner): the same exit codes and stderr lines, without six cold starts.
        return cli_runner.ahc("xdb", *args, "--data-dir", str(tmp_path / "d"))

    assert [s["session_id"] for s in json.loads(ahc("sessions").stdout)] == ["s"]
    assert len(json.loads(ahc("session-versions", "--session", "s").stdout)) == 2
    assert json.loads(ahc("rollback", "--session", "s", "--version", "1").stdout)["version"] == 3
    missing = ahc("rollback", "--session", "s", "--version", "7")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "version 7" in missing.stderr
    assert json.loads(ahc("delete-session", "--session", "s").stdout)["session_states"] == 3
    assert ahc("delete-session", "--session", "s").returncode == 1
