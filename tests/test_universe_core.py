"""Symbols, rule files, the instruments and the bundled universes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import universe
from universe import (
    SYMBOLS,
    Rule,
    coordinate_class,
    decode,
    encode,
    load_rule,
    neighbor_config,
    simulate,
    transition_indicator,
)
from universe.sampling import random_states


def test_symbols_and_round_trip() -> None:
    assert SYMBOLS == "_ABK"
    cells = encode("_ABK_K")
    assert cells.dtype == np.uint8 and cells.tolist() == [0, 1, 2, 3, 0, 3]
    assert decode(cells) == "_ABK_K"


@pytest.mark.parametrize("bad, words", [("A_X", "'X' at cell 2"), ("", "empty grid")])
def test_encode_rejects_bad_states(bad: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        encode(bad)


def test_bundled_rules_load_and_default_is_kinetic() -> None:
    assert {"kinetic", "annihilate", "sticky", "mirror2", "turnstile3"} <= set(universe.bundled_rules())
    assert universe.DEFAULT_RULE == "kinetic"
    periods = {name: load_rule(name).period for name in universe.bundled_rules()}
    assert {1, 2, 3} <= set(periods.values())
    kinetic = load_rule("kinetic")
    assert kinetic.period == 1 and len(kinetic.table[0]) == 64


def test_load_rule_from_a_file_and_round_trip(tmp_path: Path) -> None:
    rule = universe.random_rule(3, np.random.default_rng(1), name="mine")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(rule.to_dict()))
    assert load_rule(str(path)) == rule
    assert load_rule(path).lut.shape == (3, 64)
    assert load_rule(rule.to_dict()) == rule
    assert np.array_equal(simulate("A_B_K", str(path), 2, "numpy"), simulate("A_B_K", rule, 2, "numpy"))


@pytest.mark.parametrize("data, words", [
    ({"name": "x", "period": 1, "table": ["_" * 63]}, "table\\[0\\] must be a string of 64"),
    ({"name": "x", "period": 1, "table": ["_" * 63 + "Z"]}, "table\\[0\\]\\[63\\] is 'Z'"),
    ({"name": "x", "period": 2, "table": ["_" * 64]}, "list of 2 strings"),
    ({"name": "x", "period": 0, "table": []}, "period must be a positive integer"),
    ({"name": "x", "table": ["_" * 64]}, "missing period"),
])
def test_bad_rule_files_name_the_problem(tmp_path: Path, data: dict, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=words):
        load_rule(str(path))


def test_unknown_rule_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no-such-rule"):
        load_rule("no-such-rule")
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_rule(str(path))


def test_neighbor_config_wraps_around_the_ring() -> None:
    assert neighbor_config("AB_K", 0) == "KAB"
    assert neighbor_config("AB_K", 3) == "_KA"
    assert neighbor_config("A", 0) == "AAA"  # a one-cell ring is its own neighbours
    assert neighbor_config("AB", 1) == "ABA"


def test_coordinate_class_and_transition_indicator() -> None:
    assert [coordinate_class(i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="period"):
        coordinate_class(1, 0)
    assert transition_indicator("A__B", "_AB_") == 4
    assert transition_indicator("A__B", "A__B") == 0
    batch = np.array([[0, 1, 2], [3, 3, 3]], dtype=np.uint8)
    assert transition_indicator(batch, np.array([[0, 1, 1], [0, 0, 0]], dtype=np.uint8)).tolist() == [1, 3]
    with pytest.raises(ValueError, match="same shape|one shape"):
        transition_indicator("A_", "A__")


def kinetic_by_particles(state: str, steps: int) -> list[str]:
    """The prose definition: right-movers (A, K) step right, left-movers (B, K) step left."""
    length = len(state)
    right = {i for i, s in enumerate(state) if s in "AK"}
    left = {i for i, s in enumerate(state) if s in "BK"}
    rows = [state]
    for _ in range(steps):
        right = {(i + 1) % length for i in right}
        left = {(i - 1) % length for i in left}
        rows.append("".join(SYMBOLS[(i in right) + 2 * (i in left)] for i in range(length)))
    return rows


def test_kinetic_matches_its_prose_definition() -> None:
    rng = np.random.default_rng(7)
    rule = load_rule("kinetic")
    for length in (1, 2, 3, 4, 7, 16, 33):
        states = rng.integers(0, 4, size=(8, length), dtype=np.uint8)
        trajectory = simulate(states, rule, 6, backend="numpy")
        for b in range(8):
            assert [decode(r) for r in trajectory[:, b]] == kinetic_by_particles(decode(states[b]), 6)


def test_kinetic_is_centre_blind_and_conserves_particles() -> None:
    table = load_rule("kinetic").table[0]
    for window in range(64):
        left, right = window >> 4, window & 3
        assert {table[16 * left + 4 * centre + right] for centre in range(4)} == {table[window]}
    trajectory = simulate(random_states(np.random.default_rng(3), 64, 40), "kinetic", 30,
                          backend="numpy")
    right_movers = ((trajectory == 1) | (trajectory == 3)).sum(axis=-1)
    left_movers = ((trajectory == 2) | (trajectory == 3)).sum(axis=-1)
    assert (right_movers == right_movers[0]).all() and (left_movers == left_movers[0]).all()


def test_kinetic_collisions_form_and_resolve() -> None:
    rows = [decode(r) for r in simulate("_A_B__", "kinetic", 3, backend="numpy")[:, 0]]
    assert rows == ["_A_B__", "__K___", "_B_A__", "B___A_"]
    # Side by side, an A and a B pass without a collision.
    assert [decode(r) for r in simulate("AB", "kinetic", 2, backend="numpy")[:, 0]] == ["AB", "BA", "AB"]
    # Every K resolves the step after it forms: it never survives a step with nothing arriving.
    assert decode(simulate("__K__", "kinetic", 1, backend="numpy")[1, 0]) == "_B_A_"


def test_rule_from_lut_and_next_symbol() -> None:
    rule = Rule.from_lut("t", np.arange(128, dtype=np.uint8).reshape(2, 64) % 4)
    assert rule.period == 2 and rule.next_symbol(5, 3) == (64 + 5) % 4
