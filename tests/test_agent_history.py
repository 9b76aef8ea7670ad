"""The discovery agent's history across runs (xdb/run_history.py, agent/history.py): progress and
attempts written as a run goes, theorem lineage, the history read back (in Python and over the agent
routes, per tenant), a second run on a rule starting from the first's refuted laws, and the laws a
baseline run stores checked against the hidden universe's true dynamics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from routed import routed

from agent.context import karma_entries
from agent.knowledge import Knowledge, canonical
from agent.loop import DiscoveryRun, RunConfig
from agent.policies.baseline import BaselinePolicy
from agent.run_store import HttpRunStore, LocalRunStore, RunStore
from agent.tools import Toolbox
from server.http.gateway import install_gateway
from server.routes.agent_routes import agent_router
from server.tenancy.tenants import Tenant
from universe import Harness, load_rule
from universe.laws.evaluate import evaluate_laws
from universe.rule import Rule, bundled_rules
from universe.sampling import random_states
from universe.simulate import simulate
from xdb import XDB
from xdb.owner import EVERY
from xdb.run_history import Progress, record_attempt, record_progress, record_theorem_version, run_history
from xdb.runs import purge_run


@pytest.fixture(params=["local", "http"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunStore]:
    """One contract twice: an XDB of the run's own, and a server's XDB through the agent routes."""
    if request.param == "local":
        local = LocalRunStore(tmp_path / "xdb")
        yield local
        local.close()
        return
    with XDB.open(tmp_path / "server-xdb") as xdb:
        app = FastAPI()
        install_gateway(app)
        app.include_router(agent_router(xdb))
        with TestClient(app) as client:
            yield HttpRunStore("", client=client)


def run_baseline(data_dir: Path, store: RunStore, rule: str, seed: int, first_modulus: int = 6,
                 max_turns: int = 12) -> tuple[DiscoveryRun, dict[str, object]]:
    run = DiscoveryRun(RunConfig(data_dir=data_dir, max_turns=max_turns, seed=seed), load_rule(rule),
                       BaselinePolicy(first_modulus=first_modulus), store)
    return run, run.run()


def laws_sent(store: RunStore, run_id: str) -> list[str]:
    """Every law the run sent to evaluate_laws, as canonical JSON, from its interaction_log."""
    sent = []
    for row in store.interactions(run_id):
        call = json.loads(row["tool_call_json"] or "{}")
        if call.get("name") == "evaluate_laws":
            sent += [canonical(law) for law in json.loads(call["arguments"])["laws"]]
    return sent


# ---- the history store, on a real XDB file ---------------------------------------------------------
def test_progress_and_attempts_are_read_back_per_rule_and_strategy(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "xdb") as xdb:
        for run_id, strategy, status, turns in (("k-a", "baseline", "solved", 3), ("k-b", "llm:tiny", "stopped", 9),
                                                ("k-c", "llm:tiny", "solved", 7)):
            xdb.write(record_progress, run_id, Progress("kinetic", strategy, "running", turns=1))
            xdb.write(record_progress, run_id, Progress("kinetic", strategy, status, turns=turns, laws_tried=2))
        xdb.write(record_progress, "m-a", Progress("mirror2", "baseline", "solved", turns=4))
        wrong = json.dumps({"law": "invariant", "expr": {"op": "count", "symbol": "A"}})
        for run_id in ("k-b", "k-c"):
            xdb.write(record_attempt, run_id, rule="kinetic", turn=2, kind="law", subject="L1", verdict="FAIL",
                      law_json=wrong, detail="counterexample")
        # The same law in another spelling (key order) is the same law.
        respelled = json.dumps({"expr": {"symbol": "A", "op": "count"}, "law": "invariant"})
        xdb.write(record_attempt, "k-c", rule="kinetic", turn=3, kind="law", subject="L4", verdict="FAIL",
                  law_json=respelled)
        xdb.write(record_attempt, "k-a", rule="kinetic", turn=2, kind="law", subject="L1", verdict="PASS",
                  law_json=json.dumps({"law": "holds", "expr": True}))

        history = xdb.read(run_history, EVERY, "kinetic")
        assert [(r["run_id"], r["status"], r["turns"]) for r in history["runs"]] == [
            ("k-c", "solved", 7), ("k-b", "stopped", 9), ("k-a", "solved", 3)]  # each run's latest row only
        assert history["strategies"] == [
            {"strategy": "baseline", "runs": 1, "solved": 1, "min_turns": 3, "mean_turns": 3.0},
            {"strategy": "llm:tiny", "runs": 2, "solved": 1, "min_turns": 7, "mean_turns": 7.0}]
        [failed] = history["failed_laws"]
        assert (failed["fails"], failed["runs"], failed["law"]) == (3, 2, json.loads(wrong))
        assert [r["run_id"] for r in xdb.read(run_history, EVERY, None, "llm:tiny")["runs"]] == ["k-c", "k-b"]
        assert xdb.read(run_history, EVERY, "sticky")["runs"] == []

        assert xdb.write(purge_run, "k-c")["run_progress"] == 2  # a fresh run's purge takes its history too
        assert [r["run_id"] for r in xdb.read(run_history, EVERY, "kinetic")["runs"]] == ["k-b", "k-a"]


def test_a_resumed_runs_redone_turn_records_each_attempt_once(tmp_path: Path) -> None:
    """The turn a run was killed in is redone on resume: its attempts come again and are not counted twice;
    the same law with another verdict, or in another turn, is another attempt."""
    law = json.dumps({"law": "invariant", "expr": {"op": "count", "symbol": "A"}})
    with XDB.open(tmp_path / "xdb") as xdb:
        first = xdb.write(record_attempt, "r", rule="kinetic", turn=4, kind="law", subject="L1", verdict="FAIL",
                          law_json=law, detail="counterexample")
        redone = xdb.write(record_attempt, "r", rule="kinetic", turn=4, kind="law", subject="L1", verdict="FAIL",
                           law_json=law, detail="counterexample")
        submitted = [xdb.write(record_attempt, "r", rule="kinetic", turn=4, kind="submission", subject="T1",
                               verdict="FAIL") for _ in range(2)]
        other = {xdb.write(record_attempt, "r", rule="kinetic", turn=5, kind="law", subject="L1", verdict="FAIL",
                           law_json=law),
                 xdb.write(record_attempt, "r", rule="kinetic", turn=4, kind="law", subject="L1", verdict="PASS",
                           law_json=law)}
        assert redone == first and submitted[0] == submitted[1] and len(other | {first, submitted[0]}) == 4
        [failed] = xdb.read(run_history, EVERY, "kinetic")["failed_laws"]
        assert failed["fails"] == 2  # turns 4 and 5, the redone turn 4 once


@pytest.mark.parametrize("call, message", [
    (lambda x: x.write(record_progress, "r", Progress("kinetic", "baseline", "won")), "status must be one of"),
    (lambda x: x.write(record_progress, "r", Progress("kinetic", "", "running")), "strategy must not be empty"),
    (lambda x: x.write(record_progress, "r", Progress("kinetic", "b", "running", turns=-1)), "turns must be >= 0"),
    (lambda x: x.write(record_progress, "r", Progress("k", "b", "running", strategy_json="{")), "not JSON"),
    (lambda x: x.write(record_attempt, "r", rule="k", turn=1, kind="law", subject="L1", verdict="PASS"),
     "needs its law_json"),
    (lambda x: x.write(record_attempt, "r", rule="k", turn=1, kind="law", subject="L1", verdict="MAYBE",
                       law_json="{}"), "verdict must be one of"),
    (lambda x: x.write(record_theorem_version, "r", theorem_id="T1", change="retracted", turn=1, theorem_json="{}"),
     "no stored version"),
    (lambda x: x.write(record_theorem_version, "r", theorem_id="T1", change="moved", turn=1, theorem_json="{}"),
     "change must be one of"),
])
def test_bad_history_rows_are_value_errors_and_nothing_is_written(tmp_path: Path, call, message: str) -> None:
    with XDB.open(tmp_path / "xdb") as xdb:
        xdb.write(record_progress, "r", Progress("k", "b", "running", turns=1))
        with pytest.raises(ValueError, match=message):
            call(xdb)
        history = xdb.read(run_history, EVERY, None)
        assert [r["turns"] for r in history["runs"]] == [1] and history["failed_laws"] == []


# ---- theorem lineage ----------------------------------------------------------------------------
def test_an_edited_theorem_keeps_every_version_linked_to_its_parent(store: RunStore) -> None:
    box = Toolbox(Harness(load_rule("kinetic"), seed=1), store, "run", Knowledge(), "kinetic", turn=1)
    law = {"law": "invariant", "expr": {"op": "add", "args": [{"op": "count", "symbol": "A"},
                                                             {"op": "count", "symbol": "K"}]}}
    box.call("evaluate_laws", {"laws": [law]})
    box.call("store_theorem", {"name": "movers conserved", "law_ids": ["L1"], "description": "A + K is fixed"})
    box.turn = 4
    restricted = box.call("edit_theorem", {"theorem_id": "T1", "updates": {
        "status": "restricted", "reason": "only checked on short rings"}})
    assert (restricted["change"], restricted["theorem_version"]) == ("restricted", 2)
    box.turn = 6
    assert box.call("edit_theorem", {"theorem_id": "T1", "updates": {"name": "A+K conserved"}})["change"] == "renamed"
    box.turn = 9
    assert box.call("edit_theorem", {"theorem_id": "T1", "updates": {"status": "retracted"}})["change"] == "retracted"
    assert "nothing to change" in box.call("edit_theorem", {"theorem_id": "T1", "updates": {"reason": "x"}})["error"]

    lineage = store.theorem_lineage("run", "T1")
    assert [(v["version"], v["parent_version"], v["change"], v["turn"]) for v in lineage] == [
        (1, None, "stored", 1), (2, 1, "restricted", 4), (3, 2, "renamed", 6), (4, 3, "retracted", 9)]
    assert lineage[1]["reason"] == "only checked on short rings"
    assert lineage[3]["reason"] == "status: restricted -> retracted"  # no reason given: what changed
    assert [json.loads(v["theorem_json"])["name"] for v in lineage] == ["movers conserved"] * 2 + ["A+K conserved"] * 2
    current = box.call("retrieve_theorems", {"filter": ""})["theorems"]
    assert [(t["name"], t["status"]) for t in current] == [("A+K conserved", "retracted")]
    assert store.theorem_lineage("run", "T2") == [] and store.theorem_lineage("other") == []


# ---- the agent reads its history ----------------------------------------------------------------
def test_a_second_run_starts_from_the_first_runs_refuted_laws_and_repeats_none(store: RunStore,
                                                                            tmp_path: Path) -> None:
    # A first ring of modulus 1 makes period 1's table look complete, so the first run verifies it and
    # sees it FAIL on mirror2 (period 2) before it finds period 2.
    first, one = run_baseline(tmp_path / "runs", store, "mirror2", seed=0, first_modulus=1)
    assert one["solved"] and first.knowledge.prior_note == ""
    refuted = [f["law"] for f in store.history(rule="mirror2")["failed_laws"]]
    assert [law["name"] for law in refuted] == ["class 0 of 1"]
    assert canonical(refuted[0]) in laws_sent(store, first.run_id)

    second = DiscoveryRun(RunConfig(data_dir=tmp_path / "runs", max_turns=12, seed=1), load_rule("mirror2"),
                          BaselinePolicy(first_modulus=1), store)
    karma = {e["id"]: e["text"] for e in karma_entries(second.knowledge)}
    assert "class 0 of 1" in karma["prior-runs"] and "FAIL x1 in 1 run(s)" in karma["prior-runs"]
    two = second.run()
    assert two["solved"] and two["turns"] < one["turns"]  # type: ignore[operator]
    assert not set(laws_sent(store, second.run_id)) & {canonical(law) for law in refuted}

    history = store.history(rule="mirror2", strategy="baseline")
    assert {(r["run_id"], r["status"], r["turns"]) for r in history["runs"]} == {
        (first.run_id, "solved", one["turns"]), (second.run_id, "solved", two["turns"])}
    assert history["strategies"][0]["min_turns"] == two["turns"]
    design = json.loads(history["runs"][0]["strategy_json"])["design"]
    assert design["first_modulus"] == 1 and "1" in design["falsified"]


def test_progress_is_written_every_turn_not_only_at_the_end(tmp_path: Path) -> None:
    store = LocalRunStore(tmp_path / "xdb")
    try:
        run = DiscoveryRun(RunConfig(data_dir=tmp_path, max_turns=2, seed=0), load_rule("turnstile3"),
                           BaselinePolicy(first_modulus=1), store)
        run.turn(1)
        [row] = store.history(rule="turnstile3")["runs"]
        assert (row["status"], row["turns"], row["laws_tried"]) == ("running", 1, 0)
        run.turn(2)  # period 1's table verified: its law FAILs
        [row] = store.history(rule="turnstile3")["runs"]
        assert (row["status"], row["turns"], row["laws_tried"], row["laws_failed"]) == ("running", 2, 1, 1)
    finally:
        store.close()


# ---- the stored theorems are true of the hidden universe ------------------------------------------
def true_trajectories(rule: Rule, seed: int) -> list[np.ndarray]:
    """One step of the true rule from random rings of several lengths (a period's multiple and not)."""
    rng = np.random.default_rng(seed)
    return [simulate(random_states(rng, 64, length), rule, 1) for length in (5, 12, 31, 60)]


@pytest.mark.parametrize("rule_name", bundled_rules())
def test_the_laws_a_baseline_run_stores_hold_on_the_true_rule(rule_name: str, tmp_path: Path) -> None:
    store = LocalRunStore(tmp_path / "xdb")
    try:
        run, summary = run_baseline(tmp_path / "runs", store, rule_name, seed=0)
        theorems = json.loads(store.meta_knowledge(run.run_id)["theorems_json"])  # type: ignore[index]
    finally:
        store.close()
    rule = load_rule(rule_name)
    laws = [law for t in theorems if t["status"] != "retracted" for law in t["laws"]]
    assert summary["solved"] and len(laws) == rule.period  # one law per class of the true period
    trajectories = true_trajectories(rule, seed=12345)  # states the run never saw
    assert [v["status"] for v in evaluate_laws(laws, trajectories, rule)] == ["PASS"] * len(laws)
    # The check can fail: the same law with one window's next symbol changed is refuted.
    wrong = json.loads(json.dumps(laws[0]).replace('"symbol", "value": "_"', '"symbol", "value": "K"', 1))
    assert wrong != laws[0]
    assert evaluate_laws([wrong], trajectories, rule)[0]["status"] == "FAIL"


# ---- over HTTP, per tenant --------------------------------------------------------------------------
@pytest.fixture
def tenant_app(tmp_path: Path) -> Iterator[tuple[TestClient, list[Tenant]]]:
    with XDB.open(tmp_path / "xdb") as xdb, routed(agent_router(xdb)) as served:
        yield served


def test_history_and_lineage_are_the_tenants_own_over_http(tenant_app: tuple[TestClient, list[Tenant]]) -> None:
    client, current = tenant_app
    law = json.dumps({"law": "invariant", "expr": {"op": "count", "symbol": "B"}})
    for name, turns in (("alice", 3), ("bob", 8)):
        current[0] = Tenant(name)
        body = {"run_id": "r1", "rule": "kinetic", "strategy": "baseline", "status": "solved", "turns": turns}
        assert client.post("/v1/xdb/run_progress", json=body).status_code == 200
        assert client.post("/v1/xdb/run_attempts", json={
            "run_id": "r1", "rule": "kinetic", "turn": 1, "kind": "law", "subject": "L1", "verdict": "FAIL",
            "law_json": law}).status_code == 200
        assert client.post("/v1/xdb/theorem_versions", json={
            "run_id": "r1", "theorem_id": "T1", "change": "stored", "turn": 2,
            "theorem_json": json.dumps({"name": name})}).json() == {"version": 1}
    current[0] = Tenant("alice")
    history = client.get("/v1/xdb/runs/history", params={"rule": "kinetic"}).json()
    assert [(r["run_id"], r["turns"]) for r in history["runs"]] == [("r1", 3)]  # unscoped, bob's not there
    assert [(f["fails"], f["runs"]) for f in history["failed_laws"]] == [(1, 1)]
    lineage = client.get("/v1/xdb/theorem_versions", params={"run_id": "r1"}).json()["data"]
    assert [(v["run_id"], json.loads(v["theorem_json"])["name"]) for v in lineage] == [("r1", "alice")]
    assert client.get("/v1/xdb/runs/history", params={"strategy": "llm"}).json()["runs"] == []


@pytest.mark.parametrize("path, body, param", [
    ("/v1/xdb/run_progress", {"run_id": "r", "rule": "k", "strategy": "b", "status": "won", "turns": 1}, "status"),
    ("/v1/xdb/run_progress", {"run_id": "r", "rule": "k", "strategy": "b", "status": "running", "turns": -1},
     "turns"),
    ("/v1/xdb/run_progress", {"run_id": "r", "rule": "k", "strategy": "b", "status": "running", "turns": 1,
                              "strategy_json": "{"}, None),
    ("/v1/xdb/run_attempts", {"run_id": "r", "rule": "k", "turn": 1, "kind": "law", "subject": "L1",
                              "verdict": "PASS"}, None),
    ("/v1/xdb/theorem_versions", {"run_id": "r", "theorem_id": "T1", "change": "retracted", "turn": 1,
                                  "theorem_json": "{}"}, "theorem_id"),
])
def test_bad_history_requests_are_400_in_the_apis_error_shape(tenant_app: tuple[TestClient, list[Tenant]],
                                                              path: str, body: dict[str, object],
                                                              param: str | None) -> None:
    client, _ = tenant_app
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] and (param is None or param in (error.get("param") or error["message"]))
    assert client.get("/v1/xdb/runs/history").json()["runs"] == []
    assert client.get("/v1/xdb/runs/history", params={"limit": 0}).status_code == 400
