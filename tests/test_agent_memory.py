"""The agent's memory: the run store (local XDB and the server's agent routes behind one interface),
the theorem tools, query_log recalling an earlier trajectory, and malformed calls as error results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from agent.journal import ToolCall
from agent.knowledge import Knowledge
from agent.loop import DiscoveryRun, RunConfig
from agent.policies.base import Reply, TurnInput
from agent.policies.baseline import BaselinePolicy
from agent.run_store import HttpRunStore, LocalRunStore
from agent.tools import Toolbox, tool_schemas
from server.http.gateway import install_gateway
from server.routes.agent_routes import agent_router
from universe import Harness, load_rule
from xdb import XDB
from xdb.run_history import HISTORY_TABLES

# A run's purge also counts its history across runs (xdb/run_history.py): none in these tests.
NO_HISTORY = dict.fromkeys(HISTORY_TABLES, 0)


@pytest.fixture(params=["local", "http"])
def store(request, tmp_path: Path):
    """The same contract twice: an XDB of the run's own, and a server's XDB over HTTP."""
    if request.param == "local":
        store = LocalRunStore(tmp_path / "xdb")
        yield store
        store.close()
        return
    xdb = XDB.open(tmp_path / "server-xdb")
    app = FastAPI()
    install_gateway(app)
    app.include_router(agent_router(xdb))
    with TestClient(app) as client:
        store = HttpRunStore("", client=client)
        yield store
    xdb.close()


def test_run_store_round_trip_and_purge(store) -> None:
    first = store.log_interaction("r1", journal_entry="saw AA_B", tool_call_json='{"turn": 1}',
                                  tool_result_json='{"result": "FAIL"}', token_count=12)
    store.log_interaction("r1", journal_entry=None, tool_call_json='{"turn": 2}', tool_result_json="{}", token_count=3)
    store.log_interaction("other", journal_entry="AA_B elsewhere", tool_call_json=None, tool_result_json=None,
                          token_count=None)
    rows = store.interactions("r1")
    assert [r["turn_id"] for r in rows] == [first, first + 1] and rows[0]["token_count"] == 12
    assert [r["turn_id"] for r in store.interactions("r1", pattern="AA_B")] == [first]
    assert [r["turn_id"] for r in store.interactions("r1", last=1)] == [first + 1]
    assert store.meta_knowledge("r1") is None
    store.save_meta_knowledge("r1", theorems_json="[]", negative_knowledge="A is not conserved", last_compacted_turn=2)
    version = store.save_meta_knowledge("r1", theorems_json='[{"id": "T1"}]', negative_knowledge=None,
                                        last_compacted_turn=3)
    latest = store.meta_knowledge("r1")
    assert latest["version_id"] == version and latest["last_compacted_turn"] == 3
    assert store.purge("r1") == {"interaction_log": 2, "meta_knowledge": 2, **NO_HISTORY}
    assert store.interactions("r1") == [] and store.meta_knowledge("r1") is None
    assert len(store.interactions("other")) == 1  # other runs are untouched


@pytest.mark.parametrize("run_id", ["a/b", "../x", "what?x=1", "frag#1", "with space", "100%", "..", "."])
def test_a_run_id_reaches_the_store_whole_whatever_its_characters(store, run_id: str) -> None:
    store.log_interaction(run_id, journal_entry="mine", tool_call_json=None, tool_result_json=None, token_count=1)
    store.save_meta_knowledge(run_id, theorems_json="[]", negative_knowledge=None, last_compacted_turn=None)
    store.log_interaction("a", journal_entry="other", tool_call_json=None, tool_result_json=None, token_count=1)
    assert [r["journal_entry"] for r in store.interactions(run_id)] == ["mine"]
    assert store.purge(run_id) == {"interaction_log": 1, "meta_knowledge": 1, **NO_HISTORY}
    assert store.interactions(run_id) == [] and store.meta_knowledge(run_id) is None
    assert len(store.interactions("a")) == 1  # no other run was purged


def test_agent_routes_reject_bad_requests(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "xdb") as xdb:
        app = FastAPI()
        install_gateway(app)
        app.include_router(agent_router(xdb))
        with TestClient(app) as client:
            for method, path, kwargs, param in [
                ("GET", "/v1/xdb/interactions", {}, "run_id"),
                ("GET", "/v1/xdb/interactions", {"params": {"run_id": "r", "last": "0"}}, "last"),
                ("POST", "/v1/xdb/interactions", {"json": {"journal_entry": "x"}}, "run_id"),
                ("POST", "/v1/xdb/interactions", {"json": {"run_id": "r", "token_count": -1}}, "token_count"),
                ("POST", "/v1/xdb/interactions", {"json": {"run_id": "r", "token_count": 10**30}}, "token_count"),
                # past INTEGER (the column's type) but within BIGINT: once a database error, a 500
                ("POST", "/v1/xdb/interactions", {"json": {"run_id": "r", "token_count": 2**31}}, "token_count"),
                ("GET", "/v1/xdb/interactions", {"params": {"run_id": "r", "after_turn": str(10**30)}}, "after_turn"),
                ("POST", "/v1/xdb/meta_knowledge", {"json": {"run_id": "r", "surprise": 1}}, "surprise"),
                ("POST", "/v1/xdb/meta_knowledge", {"content": b"not json"}, "body"),
            ]:
                response = client.request(method, path, **kwargs)
                assert response.status_code == 400, (path, kwargs, response.text)
                assert response.json()["error"]["param"] == param


def toolbox(store, run_id: str = "run") -> Toolbox:
    return Toolbox(Harness(load_rule("kinetic"), seed=1), store, run_id, Knowledge(), "kinetic", turn=1)


def test_theorem_tools(store) -> None:
    box = toolbox(store)
    law = {"law": "invariant", "expr": {"op": "add", "args": [{"op": "count", "symbol": "A"},
                                                             {"op": "count", "symbol": "K"}]}}
    wrong = {"law": "invariant", "expr": {"op": "count", "symbol": "A"}}
    verdicts = box.call("evaluate_laws", json.dumps({"laws": [law, wrong]}))["results"]
    assert [(v["law_id"], v["status"]) for v in verdicts] == [("L1", "PASS"), ("L2", "FAIL")]
    assert "only laws that passed" in box.call(
        "store_theorem", {"name": "n", "law_ids": ["L2"], "description": "d"})["error"]
    assert "unknown law id" in box.call("store_theorem", {"name": "n", "law_ids": ["L9"], "description": "d"})["error"]
    stored = box.call("store_theorem", {"name": "right-movers conserved", "law_ids": ["L1"],
                                        "description": "A + K never changes"})
    assert stored["stored"] == "T1"
    assert box.call("retrieve_theorems", {"filter": "conserved"})["count"] == 1
    assert box.call("retrieve_theorems", {"filter": "nothing like it"})["count"] == 0
    edited = box.call("edit_theorem", {"theorem_id": "T1", "updates": {"status": "restricted"}})
    assert edited["theorem"]["status"] == "restricted"
    assert "status must be one of" in box.call(
        "edit_theorem", {"theorem_id": "T1", "updates": {"status": "maybe"}})["error"]
    assert "no theorem 'T7'" in box.call("edit_theorem", {"theorem_id": "T7", "updates": {"name": "x"}})["error"]
    latest = json.loads(store.meta_knowledge("run")["theorems_json"])
    assert latest[0]["status"] == "restricted" and latest[0]["laws"] == [law]


@pytest.mark.parametrize("name, arguments, message", [
    ("query_log", "-Infinity", "arguments must be a JSON object"),
    ("query_log", '{"query": ', "arguments must be a JSON object"),
    ("store_theorem", {"name": "x"}, "missing argument 'law_ids'"),
    ("retrieve_theorems", {"filter": 3}, "argument 'filter' must be of JSON type string"),
    ("run_prediction", '{"state_t0": "A_B", "predicted_t1": "A"}', "predicted_t1 has 1 cells"),
    ("teleport", "{}", "unknown tool 'teleport'"),
])
def test_malformed_calls_are_error_results(name: str, arguments, message: str, tmp_path: Path) -> None:
    store = LocalRunStore(tmp_path / "xdb")
    try:
        assert message in toolbox(store).call(name, arguments)["error"]
    finally:
        store.close()


def test_query_log_recalls_an_earlier_trajectory(tmp_path: Path) -> None:
    store = LocalRunStore(tmp_path / "xdb")
    try:
        run = DiscoveryRun(RunConfig(tmp_path), load_rule("mirror2"), BaselinePolicy(), store)
        assert run.run()["solved"]
        # The first turn's experiment: the design ring and its true next state, long out of any prompt.
        first = json.loads(store.interactions(run.run_id)[0]["tool_result_json"])
        truth = first["counterexample"]["trajectory"][1]
        box = Toolbox(run.harness, store, run.run_id, run.knowledge, run.rule_label, valid_row=run.ckpt.valid_row)
        found = box.call("query_log", {"query": truth[100:124]})
        assert found["matches"] == 1 and found["turns"][0]["turn"] == 1
        assert found["turns"][0]["tool"] == "run_prediction"
        # Words, not a pattern: the turns sharing the most of them.
        found = box.call("query_log", {"query": "refutation attempt evaluate_laws"})
        assert found["turns"][0]["turn"] == 2 and found["turns"][0]["tool"] == "evaluate_laws"
        assert box.call("query_log", {"query": "ZZZZ"})["matches"] == 0
    finally:
        store.close()


class ScriptedPolicy(BaselinePolicy):
    """Replies as a careless model would: garbage arguments, no call at all, then a fine call."""

    def decide(self, turn: TurnInput) -> Reply:
        script = {1: Reply(note="<tool_call>{\"name\": \"run_pre", error="no tool call"),
                  2: Reply(note="try", calls=[ToolCall("c2", "run_prediction", "Infinity")]),
                  3: Reply(note="again", calls=[ToolCall("c3", "run_prediction",
                                                         '{"state_t0": "A__B", "predicted_t1": "_AB_"}')])}
        return script[turn.turn]


def test_the_run_goes_on_after_malformed_replies(tmp_path: Path) -> None:
    store = LocalRunStore(tmp_path / "xdb")
    try:
        run = DiscoveryRun(RunConfig(tmp_path, max_turns=3), load_rule("kinetic"), ScriptedPolicy(name="scripted"),
                           store)
        summary = run.run()
        assert summary["turns"] == 3 and summary["experiments"] == 1
        results = [json.loads(r["tool_result_json"]) for r in store.interactions(run.run_id)]
        assert results[0] == {"error": "no tool call"}
        assert "arguments must be a JSON object" in results[1]["error"]
        assert results[2] == {"result": "PASS"}
        # The next question tells the policy what went wrong.
        assert "Last turn: no tool call" in run.journal.entries[1].query
    finally:
        store.close()


def test_compact_tool_schemas_name_the_same_tools() -> None:
    names = [t["function"]["name"] for t in tool_schemas("full")]
    assert names == [t["function"]["name"] for t in tool_schemas("compact")]
    minimal = {t["function"]["name"] for t in tool_schemas("minimal")}
    assert set(names) - minimal == {"retrieve_theorems", "edit_theorem"}
    assert len(json.dumps(tool_schemas("minimal"))) < len(json.dumps(tool_schemas("full"))) / 3
