"""The law language: true laws PASS, false ones FAIL with a small counterexample that really breaks
them, and a malformed law is refused naming its node."""

from __future__ import annotations

import json

import numpy as np
import pytest

from universe import decode, encode, load_rule, simulate
from universe.laws import LAW_SCHEMA, LawError, evaluate_laws, parse_law
from universe.laws.evaluate import violations
from universe.sampling import coverage_states, random_states


def count(symbol: str) -> dict:
    return {"op": "count", "symbol": symbol}


def add(*args) -> dict:
    return {"op": "add", "args": list(args)}


def batches(rule_name: str, steps: int = 12, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    rule = load_rule(rule_name)
    out = [simulate(random_states(rng, 24, length), rule, steps, "numpy") for length in (1, 2, 3, 5, 8, 13, 32)]
    return out + [simulate(coverage_states(), rule, steps, "numpy")]


TRUE_LAWS = {
    "kinetic": [
        {"law": "invariant", "expr": add(count("A"), count("K"))},
        {"law": "invariant", "expr": add(count("B"), count("K"))},
        {"law": "local_transition", "context": "A.B", "becomes": "K"},
        {"law": "local_transition", "context": "_._", "becomes": "_"},
        {"law": "symmetry", "reflect": True, "permute": {"A": "B", "B": "A"}},
        {"law": "symmetry", "shift": 1},
        {"law": "implication", "if": {"op": "eq", "args": [{"op": "cell"}, {"op": "symbol", "value": "K"}]},
         "then": {"op": "eq", "args": [{"op": "transition_indicator"}, {"op": "transition_indicator"}]}},
        {"law": "holds", "expr": {"op": "eq", "args": [{"op": "sum", "expr": {"op": "changed"}},
                                                       {"op": "transition_indicator"}]}},
        {"law": "holds", "expr": {"op": "le", "args": [add(count("_"), count("A"), count("B"), count("K")),
                                                       {"op": "length"}]}},
    ],
    "annihilate": [
        {"law": "invariant", "expr": {"op": "sub", "args": [count("A"), count("B")]}},
        {"law": "monotone", "direction": "nonincreasing",
         "expr": add(count("A"), count("B"), {"op": "mul", "args": [2, count("K")]})},
    ],
    "sticky": [
        {"law": "monotone", "direction": "nondecreasing", "expr": count("K")},
        {"law": "monotone", "direction": "nonincreasing", "expr": add(count("A"), count("B"))},
        {"law": "local_transition", "context": ".K.", "becomes": "K"},
    ],
    "mirror2": [
        {"law": "invariant", "expr": add(count("A"), count("B"), count("K"), count("K"))},
        {"law": "local_transition", "context": "A._", "becomes": "B", "period": 2, "class": 1},
        {"law": "local_transition", "context": "A._", "becomes": "A", "period": 2, "class": 0},
    ],
    "turnstile3": [
        {"law": "invariant", "expr": add(count("A"), count("K"))},
        {"law": "monotone", "direction": "nonincreasing", "expr": add(count("B"), count("K"))},
        {"law": "holds", "expr": {"op": "implies", "args": [
            {"op": "eq", "args": [{"op": "coordinate_class", "period": 3}, 0]},
            {"op": "not", "expr": {"op": "or", "args": [
                {"op": "eq", "args": [{"op": "next", "expr": {"op": "cell"}}, {"op": "symbol", "value": "B"}]},
                {"op": "eq", "args": [{"op": "next", "expr": {"op": "cell"}}, {"op": "symbol", "value": "K"}]}]}}]}},
    ],
}

FALSE_LAWS = {
    "kinetic": [
        {"law": "invariant", "expr": count("A")},
        {"law": "local_transition", "context": "A.A", "becomes": "B"},
        {"law": "symmetry", "reflect": True},
        {"law": "monotone", "direction": "nonincreasing", "expr": count("K")},
        {"law": "holds", "expr": {"op": "eventually", "within": 3, "expr": {"op": "eq", "args": [count("K"), 0]}}},
        {"law": "holds", "expr": {"op": "always", "within": 2, "expr": {
            "op": "ne", "args": [{"op": "neighbor_config"}, {"op": "window", "value": "A_B"}]}}},
        {"law": "implication", "if": {"op": "matches", "pattern": "A"},
         "then": {"op": "eq", "args": [{"op": "at", "dt": 2, "expr": {"op": "cell", "offset": 2}},
                                       {"op": "symbol", "value": "A"}]}},
    ],
    "mirror2": [
        {"law": "local_transition", "context": "A._", "becomes": "A"},
        {"law": "symmetry", "shift": 1},
    ],
    "turnstile3": [
        {"law": "invariant", "expr": add(count("B"), count("K"))},
        {"law": "holds", "expr": {"op": "eq", "args": [{"op": "count_pattern", "pattern": "B"}, 0]}},
    ],
}


@pytest.mark.parametrize("rule_name", sorted(TRUE_LAWS))
def test_true_laws_pass(rule_name: str) -> None:
    results = evaluate_laws(TRUE_LAWS[rule_name], batches(rule_name), load_rule(rule_name))
    assert [r["status"] for r in results] == ["PASS"] * len(TRUE_LAWS[rule_name]), results


@pytest.mark.parametrize("rule_name", sorted(FALSE_LAWS))
def test_false_laws_fail_with_a_counterexample_that_breaks_them(rule_name: str) -> None:
    rule = load_rule(rule_name)
    laws = FALSE_LAWS[rule_name]
    results = evaluate_laws(laws, batches(rule_name), rule)
    for law, result in zip(laws, results):
        assert result["status"] == "FAIL", law
        found = result["counterexample"]
        rows = found["trajectory"]
        parsed = parse_law(law)
        assert len(rows) == parsed.reach + 1  # shrunk in time: just the steps the law looks at
        # It is a genuine trajectory of the rule ...
        start = encode(rows[0])
        assert [decode(r) for r in simulate(start, rule, len(rows) - 1, "numpy")[:, 0]] == rows
        # ... that breaks the law at t = 0 ...
        trajectory = np.stack([encode(r) for r in rows])[:, None, :]
        assert violations(parsed, trajectory, rule)[0, 0]
        # ... and it is small: no ring of one cell fewer (a cyclic window of it) breaks the law.
        assert len(rows[0]) <= 8, found


def test_counterexample_details() -> None:
    rule = load_rule("kinetic")
    (invariant, local) = evaluate_laws([FALSE_LAWS["kinetic"][0], FALSE_LAWS["kinetic"][1]], batches("kinetic"), rule)
    detail = invariant["counterexample"]["detail"]
    assert detail["value_at_t"] != detail["value_at_t+1"]
    assert (invariant["counterexample"]["detail"]["value_at_t"]
            == invariant["counterexample"]["trajectory"][0].count("A"))
    found = local["counterexample"]
    cell = found["cell"]
    row0, row1 = found["trajectory"]
    length = len(row0)
    assert row0[(cell - 1) % length] == "A" and row0[(cell + 1) % length] == "A" and row1[cell] != "B"
    assert found["detail"]["neighbor_config"][0] == found["detail"]["neighbor_config"][2] == "A"


def test_one_law_of_many_fails_without_hiding_the_others() -> None:
    laws = TRUE_LAWS["kinetic"][:2] + FALSE_LAWS["kinetic"][:1] + TRUE_LAWS["kinetic"][2:3]
    results = evaluate_laws(laws, batches("kinetic"), load_rule("kinetic"))
    assert [r["status"] for r in results] == ["PASS", "PASS", "FAIL", "PASS"]
    assert [r["law"] for r in results] == [0, 1, 2, 3]


def test_without_a_rule_the_failing_slice_is_returned() -> None:
    trajectory = simulate("A_B___", "kinetic", 4, "numpy")
    (result,) = evaluate_laws([{"law": "invariant", "expr": count("K"), "name": "k"}], trajectory)
    assert result["status"] == "FAIL" and result["name"] == "k"
    assert result["counterexample"]["trajectory"] == ["A_B___", "_K____"]
    with pytest.raises(ValueError, match="symmetry law needs the rule"):
        evaluate_laws([{"law": "symmetry", "shift": 1}], trajectory)
    with pytest.raises(ValueError, match="looks 5 steps ahead"):
        evaluate_laws([{"law": "holds", "expr": {"op": "eventually", "within": 5, "expr": True}}], trajectory)


@pytest.mark.parametrize("law, where, words", [
    ({"law": "holds", "expr": {"op": "cuont", "symbol": "A"}}, "$.expr ('cuont')", "unknown op 'cuont'"),
    ({"law": "holds", "expr": {"op": "and", "args": [True, count("A")]}}, "$.expr ('and')",
     "expects bool arguments, got int at $.expr.args[1]"),
    ({"law": "holds", "expr": {"op": "eq", "args": [count("A"), True]}}, "$.expr ('eq')", "compares int with bool"),
    ({"law": "holds", "expr": count("A")}, "$ ('holds')", "must be boolean"),
    ({"law": "invariant", "expr": {"op": "cell"}}, "$ ('invariant')", "global integer"),
    ({"law": "holds", "expr": {"op": "count", "symbol": "Q"}}, "$.expr ('count')", "'Q', outside _ABK"),
    ({"law": "holds", "expr": {"op": "count", "sybmol": "A"}}, "$.expr ('count')", "unknown field 'sybmol'"),
    ({"law": "holds", "expr": {"op": "eventually", "within": 99, "expr": True}}, "$.expr ('eventually')", "0..64"),
    ({"law": "holds", "expr": {"op": "not", "args": [True, False]}}, "$.expr ('not')", "takes 1..1 arguments"),
    ({"law": "holds", "expr": "A"}, "$.expr", "bare string"),
    ({"law": "conserved", "expr": count("A")}, "$ ('conserved')", "unknown law kind"),
    ({"law": "local_transition", "context": "AB", "becomes": "K"}, "$ ('local_transition')", "3 symbols"),
    ({"law": "local_transition", "context": "A_B", "becomes": "K", "period": 2, "class": 2}, "$ ('local_transition')",
     "'class' must be an integer in 0..1"),
    ({"law": "symmetry", "permute": {"A": "B"}}, "$ ('symmetry')", "not a permutation"),
    ({"law": "symmetry"}, "$ ('symmetry')", "identity"),
    ({"law": "monotone", "expr": count("A"), "direction": "up"}, "$ ('monotone')", "direction"),
    ({"law": "holds", "expr": {"op": "matches", "pattern": "AB"}}, "$.expr ('matches')", "odd length"),
    ({"law": "holds", "expr": {"op": "eq", "args": [{"op": "mod", "args": [count("A"), 0]}, 0]}},
     "$.expr.args[0] ('mod')", "positive integer literal"),
])
def test_malformed_laws_name_the_node(law: dict, where: str, words: str) -> None:
    with pytest.raises(LawError) as caught:
        parse_law(law)
    assert str(caught.value).startswith(where), str(caught.value)
    assert words in str(caught.value)


def test_evaluate_laws_names_the_law_index() -> None:
    with pytest.raises(ValueError, match=r"laws\[1\]\.expr \('nope'\)"):
        evaluate_laws([TRUE_LAWS["kinetic"][0], {"law": "holds", "expr": {"op": "nope"}}], batches("kinetic"))


def test_schema_lists_every_law_kind_and_op() -> None:
    kinds = {form["properties"]["law"]["const"] for form in LAW_SCHEMA["$defs"]["law"]["oneOf"]}
    assert kinds == {"holds", "implication", "invariant", "monotone", "local_transition", "symmetry"}
    ops = LAW_SCHEMA["$defs"]["expr"]["oneOf"][2]["properties"]["op"]["enum"]
    for op in ("count", "count_pattern", "transition_indicator", "neighbor_config", "coordinate_class", "cell",
               "add", "lt", "and", "at", "next", "always", "eventually"):
        assert op in ops


def test_the_bounded_law_schema_admits_shallow_laws_and_refuses_deep_ones() -> None:
    import jsonschema

    from universe.laws.json_schema import bounded_law_schema

    schema = bounded_law_schema(depth=1, max_args=2)
    shallow = {"law": "holds", "expr": {"op": "ge", "args": [{"op": "count", "symbol": "A"}, 0]}}
    jsonschema.validate(shallow, schema)
    parse_law(shallow)  # what the grammar admits, the harness's parser reads
    deep = {"law": "holds", "expr": {"op": "not", "expr": {"op": "ge", "args": [{"op": "count", "symbol": "A"}, 0]}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(deep, schema)
    with pytest.raises(jsonschema.ValidationError):  # max_args
        jsonschema.validate({"law": "holds", "expr": {"op": "and", "args": [True, True, True]}}, schema)
    assert "description" not in json.dumps(schema)
    with pytest.raises(ValueError, match="depth"):
        bounded_law_schema(depth=-1)
