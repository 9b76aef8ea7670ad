"""The physics harness: the hidden rule behind the agent's tools.

The agent never sees the rule. It learns through four tools: `evaluate_laws` (PASS, or FAIL with a
small counterexample), `run_prediction` (opaque: PASS, or FAIL with the true trajectory; the truth is
never handed out without a prediction), `request_samples` (trajectory slices holding a pattern) and
`submit_theory` (the termination check). The counters are what a run reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from universe import tools
from universe.laws.ast import LawError, parse_law
from universe.laws.evaluate import evaluate_laws
from universe.rule import Rule
from universe.sampling import coverage_states, plant, random_states
from universe.simulate import simulate
from universe.symbols import SYMBOLS, WINDOWS, decode, encode

LAW_LENGTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 16, 24, 32, 48, 64)
LAW_GRIDS = 32          # random rings per length when judging laws (plus the 64 de Bruijn rings)
LAW_SLACK = 8           # steps simulated beyond what the laws look ahead
MAX_LAWS = 32
MAX_STATE = 4096
THEORY_STATES = 5000
THEORY_LENGTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65,
                  96, 128)
SAMPLE_LENGTHS = (4, 16)  # request_samples rings: short enough to read, long enough for context


@dataclass
class Harness:
    rule: Rule
    seed: int = 0
    backend: str = "auto"
    experiments: int = 0
    predictions_checked: int = 0
    cells_observed: int = 0
    submissions: int = 0
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def counters(self) -> dict[str, int]:
        return {"experiments": self.experiments, "predictions_checked": self.predictions_checked,
                "cells_observed": self.cells_observed, "submissions": self.submissions}

    def call_tool(self, name: str, arguments: str | dict[str, Any] | None) -> dict[str, Any]:
        """An OpenAI tool call → its result; malformed arguments give `{"error": ...}`, never raise."""
        return tools.call_tool(self, name, arguments)

    # ---- the tools ------------------------------------------------------------------------------
    def evaluate_laws(self, laws: list[Any]) -> dict[str, Any]:
        """Judge candidate laws on fresh random trajectories of many lengths, plus rings that hold
        every (window, class) pair. A malformed law gets status ERROR naming the node; the others are
        judged."""
        if not isinstance(laws, list) or not 1 <= len(laws) <= MAX_LAWS:
            raise ValueError(f"laws must be a list of 1..{MAX_LAWS} laws")
        parsed, errors = {}, {}
        for k, law in enumerate(laws):
            try:
                parsed[k] = parse_law(law, f"laws[{k}]")
            except LawError as exc:
                errors[k] = str(exc)
        results: dict[int, dict[str, Any]] = {
            k: {"law": k, "name": law.get("name") if isinstance(law, dict) else None, "status": "ERROR",
                "error": errors[k]} for k, law in enumerate(laws) if k in errors}
        steps = 0
        if parsed:
            steps = max(law.reach for law in parsed.values()) + LAW_SLACK
            batches = [simulate(random_states(self.rng, LAW_GRIDS, length), self.rule, steps, self.backend)
                       for length in LAW_LENGTHS]
            batches.append(simulate(coverage_states(), self.rule, steps, self.backend))
            judged = evaluate_laws(list(parsed.values()), batches, self.rule)
            for k, verdict in zip(parsed, judged):
                results[k] = {**verdict, "law": k}
                if verdict["counterexample"]:
                    self.cells_observed += _cells_in(verdict["counterexample"])
        self.experiments += 1
        return {"results": [results[k] for k in range(len(laws))], "steps": steps,
                "trajectories": (len(LAW_LENGTHS) * LAW_GRIDS + WINDOWS) if parsed else 0}

    def run_prediction(self, state_t0: str, predicted_t1: str) -> dict[str, Any]:
        """PASS if `predicted_t1` is the true next state of `state_t0`; else FAIL with the truth."""
        start, guess = _state(state_t0, "state_t0"), _state(predicted_t1, "predicted_t1")
        if start.shape != guess.shape:
            raise ValueError(f"predicted_t1 has {guess.shape[0]} cells but state_t0 has {start.shape[0]}")
        truth = simulate(start, self.rule, 1, "numpy")[1, 0]
        self.experiments += 1
        self.predictions_checked += 1
        self.cells_observed += start.shape[0]
        wrong = np.flatnonzero(truth != guess)
        if wrong.size == 0:
            return {"result": "PASS"}
        return {"result": "FAIL", "counterexample": {"trajectory": [state_t0, decode(truth)],
                                                     "wrong_cells": [int(i) for i in wrong]}}

    def request_samples(self, pattern: str, count: int = 4, steps: int = 1) -> dict[str, Any]:
        """`count` random rings with `pattern` ('.' = any) planted in them, each run `steps` steps."""
        if not isinstance(pattern, str) or not 1 <= len(pattern) <= 16 or not set(pattern) <= set(SYMBOLS + "."):
            raise ValueError(f"pattern must be 1..16 symbols over {SYMBOLS} or '.', got {pattern!r}")
        _bounded("count", count, 1, 32)
        _bounded("steps", steps, 1, 8)
        samples = []
        for _ in range(count):
            length = int(self.rng.integers(max(SAMPLE_LENGTHS[0], len(pattern)), SAMPLE_LENGTHS[1] + 1))
            states, _ = plant(self.rng, pattern, 1, length)
            rows = simulate(states, self.rule, steps, "numpy")[:, 0]
            samples.append({"trajectory": [decode(r) for r in rows], "matches": _matches(rows[0], pattern)})
            self.cells_observed += rows.size
        self.experiments += 1
        return {"samples": samples}

    def submit_theory(self, table: Any) -> dict[str, Any]:
        """The termination check: the theory must give every (window, class) entry and reproduce the
        true next state of 5,000 states exactly (every (window, class) pair among them). `table` is a
        list of strings, or `{"table": [...]}`; anything else is refused."""
        if isinstance(table, dict):
            table = table.get("table")
        if not isinstance(table, list) or not 1 <= len(table) <= 64 or not all(isinstance(r, str) for r in table):
            raise ValueError("table must be a list of 1..64 strings, one per coordinate class")
        self.submissions += 1
        gap = _first_gap(table)
        if gap:
            return {"solved": False, "complete": False, "accuracy": 0.0, "reason": gap}
        theory = Rule("theory", len(table), tuple(table))
        matched, total, cells_right, cells_total, first_miss = 0, 0, 0, 0, None
        for states in self._theory_states():
            truth = simulate(states, self.rule, 1, self.backend)[1]
            guess = simulate(states, theory, 1, self.backend)[1]
            right = truth == guess
            exact = right.all(axis=1)
            matched += int(exact.sum())
            total += states.shape[0]
            cells_right += int(right.sum())
            cells_total += right.size
            # Show the shortest state the theory gets wrong: the easiest to learn from.
            if not exact.all() and (first_miss is None or states.shape[1] < len(first_miss["state"])):
                k = int(np.argmin(exact))
                first_miss = {"state": decode(states[k]), "true_next": decode(truth[k]),
                              "predicted_next": decode(guess[k])}
        result: dict[str, Any] = {"solved": matched == total, "complete": True, "accuracy": matched / total,
                                  "cell_accuracy": cells_right / cells_total, "states": total}
        if first_miss:
            result["counterexample"] = first_miss
            self.cells_observed += len(first_miss["state"])
        return result

    def _theory_states(self) -> list[np.ndarray]:
        """5,000 states in batches of one length: the 64 de Bruijn rotations first (every window at
        every position, so every class of any period up to 64), then random rings of many lengths."""
        batches = [coverage_states()]
        remaining = THEORY_STATES - batches[0].shape[0]
        per_length = np.full(len(THEORY_LENGTHS), remaining // len(THEORY_LENGTHS))
        per_length[: remaining % len(THEORY_LENGTHS)] += 1
        batches += [random_states(self.rng, int(n), length) for n, length in zip(per_length, THEORY_LENGTHS)]
        return batches


def _state(text: Any, name: str) -> np.ndarray:
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a string over {SYMBOLS}")
    if len(text) > MAX_STATE:
        raise ValueError(f"{name} has {len(text)} cells; at most {MAX_STATE}")
    try:
        return encode(text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _bounded(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in {low}..{high}, got {value!r}")


def _matches(row: np.ndarray, pattern: str) -> list[int]:
    text = decode(row)
    ring = text * (len(pattern) // len(text) + 2)
    return [i for i in range(len(text))
            if all(p == "." or p == c for p, c in zip(pattern, ring[i:i + len(pattern)]))]


def _first_gap(table: list[str]) -> str | None:
    for c, row in enumerate(table):
        if len(row) != WINDOWS:
            return f"table[{c}] has {len(row)} entries; every one of the {WINDOWS} windows must be given"
        bad = next((j for j, ch in enumerate(row) if ch not in SYMBOLS), None)
        if bad is not None:
            return (f"table[{c}][{bad}] is {row[bad]!r}: every (window, class) entry must be one of "
                    f"{SYMBOLS}")
    return None


def _cells_in(found: dict[str, Any]) -> int:
    cells = sum(len(row) for row in found.get("trajectory", []))
    return cells + len(found.get("detail", {}).get("stepped_after_transform", ""))
