"""The harness tools: opaque prediction, samples, laws through the dispatcher, and the termination
check (accepts the true table, rejects one wrong in a single entry)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from universe import SYMBOLS, Rule, load_rule, simulate
from universe.harness import THEORY_STATES, Harness
from universe.symbols import decode, encode
from universe.tools import TOOL_NAMES, TOOLS


@pytest.fixture
def harness() -> Harness:
    return Harness(load_rule("kinetic"), seed=3)


def test_tools_are_openai_function_tools() -> None:
    assert TOOL_NAMES == ["evaluate_laws", "run_prediction", "request_samples", "submit_theory"]
    for tool in TOOLS:
        assert tool["type"] == "function"
        function = tool["function"]
        assert function["description"] and function["parameters"]["type"] == "object"
        assert set(function["parameters"]["required"]) <= set(function["parameters"]["properties"])
        json.dumps(tool)  # serialisable as sent to a model
    laws = TOOLS[0]["function"]["parameters"]
    assert laws["properties"]["laws"]["items"] == {"$ref": "#/$defs/law"} and "law" in laws["$defs"]


def test_run_prediction_pass_and_fail_with_the_truth(harness: Harness) -> None:
    assert harness.call_tool("run_prediction", {"state_t0": "A_B_", "predicted_t1": "_K__"}) == {"result": "PASS"}
    result = harness.call_tool("run_prediction", json.dumps({"state_t0": "A___", "predicted_t1": "A___"}))
    assert result["result"] == "FAIL"
    assert result["counterexample"] == {"trajectory": ["A___", "_A__"], "wrong_cells": [0, 1]}
    assert harness.counters() == {"experiments": 2, "predictions_checked": 2, "cells_observed": 8, "submissions": 0}


def test_run_prediction_never_reveals_without_a_prediction(harness: Harness) -> None:
    result = harness.call_tool("run_prediction", {"state_t0": "A_B_"})
    assert result == {"error": "run_prediction: missing argument 'predicted_t1'"}
    assert "error" in harness.call_tool("run_prediction", {"state_t0": "A_B_", "predicted_t1": "_K_"})
    assert harness.predictions_checked == 0 and harness.cells_observed == 0


@pytest.mark.parametrize("name, arguments, words", [
    ("run_prediction", "{not json", "not valid JSON"),
    ("run_prediction", "[1, 2]", "must be a JSON object"),
    ("run_prediction", {"state_t0": "A_X", "predicted_t1": "AAA"}, "state_t0: symbol 'X' at cell 2"),
    ("run_prediction", {"state_t0": 5, "predicted_t1": "AAA"}, "'state_t0' must be of JSON type string"),
    ("run_prediction", {"state_t0": "A", "predicted_t1": "A", "extra": 1}, "unknown argument 'extra'"),
    ("request_samples", {"pattern": "AXB"}, "pattern must be"),
    ("request_samples", {"pattern": "AB", "count": 0}, "count must be an integer in 1..32"),
    ("request_samples", {"pattern": "AB", "count": True}, "'count' must be of JSON type integer"),
    ("evaluate_laws", {"laws": []}, "laws must be a list of 1..32"),
    ("evaluate_laws", {"laws": "invariant"}, "'laws' must be of JSON type array"),
    ("submit_theory", {"table": "____"}, "'table' must be of JSON type array"),
    ("submit_theory", {"table": [1]}, "list of 1..64 strings"),
    ("fly", {}, "unknown tool 'fly'"),
])
def test_malformed_calls_return_an_error_instead_of_raising(harness: Harness, name: str, arguments,
                                                             words: str) -> None:
    result = harness.call_tool(name, arguments)
    assert set(result) == {"error"} and words in result["error"], result


def test_request_samples_contain_the_pattern_and_are_true_trajectories(harness: Harness) -> None:
    result = harness.call_tool("request_samples", {"pattern": "A.B", "count": 5, "steps": 3})
    assert json.loads(json.dumps(result)) == result
    assert len(result["samples"]) == 5
    rule = load_rule("kinetic")
    for sample in result["samples"]:
        rows = sample["trajectory"]
        assert len(rows) == 4 and sample["matches"]
        for start in sample["matches"]:
            ring = rows[0] * 2
            assert ring[start] == "A" and ring[start + 2] == "B"
        assert [decode(r) for r in simulate(rows[0], rule, 3, "numpy")[:, 0]] == rows
    assert harness.experiments == 1
    assert harness.cells_observed == sum(len(s["trajectory"][0]) * 4 for s in result["samples"])


def test_evaluate_laws_tool_judges_each_law_and_reports_errors_per_law(harness: Harness) -> None:
    laws = [
        {"law": "invariant", "name": "right-movers", "expr": {"op": "add", "args": [
            {"op": "count", "symbol": "A"}, {"op": "count", "symbol": "K"}]}},
        {"law": "invariant", "expr": {"op": "count", "symbol": "A"}},
        {"law": "holds", "expr": {"op": "count"}},
    ]
    result = harness.call_tool("evaluate_laws", {"laws": laws})
    assert json.loads(json.dumps(result)) == result  # plain JSON, ready to go back to the model
    first, second, third = result["results"]
    assert first["status"] == "PASS" and first["name"] == "right-movers"
    assert second["status"] == "FAIL" and len(second["counterexample"]["trajectory"]) == 2
    assert third["status"] == "ERROR" and third["error"].startswith("laws[2].expr ('count'): missing field 'symbol'")
    assert harness.experiments == 1
    assert harness.cells_observed == 2 * len(second["counterexample"]["trajectory"][0])


def one_entry_wrong(table: list[str], cls: int, window: int) -> list[str]:
    row = table[cls]
    wrong = SYMBOLS[(SYMBOLS.index(row[window]) + 1) % 4]
    return [r if c != cls else row[:window] + wrong + row[window + 1:] for c, r in enumerate(table)]


@pytest.mark.parametrize("rule_name", ["kinetic", "turnstile3"])
def test_termination_check_accepts_the_truth_and_rejects_a_single_wrong_entry(rule_name: str) -> None:
    rule = load_rule(rule_name)
    harness = Harness(rule, seed=11)
    accepted = harness.call_tool("submit_theory", {"table": list(rule.table)})
    assert accepted["solved"] is True and accepted["accuracy"] == 1.0 and accepted["states"] == THEORY_STATES
    rng = np.random.default_rng(0)
    for _ in range(3):
        cls, window = int(rng.integers(rule.period)), int(rng.integers(64))
        rejected = harness.call_tool("submit_theory", {"table": one_entry_wrong(list(rule.table), cls, window)})
        assert json.loads(json.dumps(rejected)) == rejected
        assert rejected["solved"] is False and rejected["complete"] is True and rejected["accuracy"] < 1.0
        miss = rejected["counterexample"]
        truth = decode(simulate(miss["state"], rule, 1, "numpy")[1, 0])
        assert miss["true_next"] == truth != miss["predicted_next"]
    assert harness.submissions == 4


def test_termination_states_hold_every_window_in_every_class() -> None:
    # Whatever single entry is wrong, some check state shows it: the de Bruijn rotations among the
    # 5,000 states hold every (window, class) pair, for any period up to 64.
    rule = load_rule("turnstile3")
    harness = Harness(rule, seed=2)
    batches = harness._theory_states()
    assert sum(b.shape[0] for b in batches) == THEORY_STATES
    assert len({b.shape[1] for b in batches}) > 20
    densities = np.concatenate([(b != 0).mean(axis=1) for b in batches[1:] if b.shape[1] >= 32])
    assert densities.min() < 0.2 and densities.max() > 0.8
    coverage = batches[0]
    truth = simulate(coverage, rule, 1, "numba")[1]
    for cls in range(rule.period):
        for window in range(64):
            wrong = Rule("wrong", rule.period, tuple(one_entry_wrong(list(rule.table), cls, window)))
            assert (simulate(coverage, wrong, 1, "numba")[1] != truth).any(), (cls, window)


def test_termination_check_needs_every_entry_and_accepts_equivalent_periods(harness: Harness) -> None:
    table = list(load_rule("kinetic").table)
    incomplete = harness.submit_theory([table[0][:63] + "?"])
    assert incomplete == {"solved": False, "complete": False, "accuracy": 0.0,
                          "reason": "table[0][63] is '?': every (window, class) entry must be one of _ABK"}
    short = harness.submit_theory([table[0][:60]])
    assert short["complete"] is False and "60 entries" in short["reason"]
    # Period 2 with both classes equal is the same physics: solved.
    assert harness.submit_theory([table[0], table[0]])["solved"] is True


def test_the_harness_is_deterministic_for_a_seed() -> None:
    first = Harness(load_rule("mirror2"), seed=5).request_samples("K", 3, 2)
    again = Harness(load_rule("mirror2"), seed=5).request_samples("K", 3, 2)
    assert first == again
    assert encode(first["samples"][0]["trajectory"][0]).size >= 4
