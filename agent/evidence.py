"""Evidence: every true transition (state_t -> state_t+1) the tools have shown, and the transition
table it implies under a hypothesised period.

The tools reveal real trajectories in several shapes (a prediction's PASS or FAIL, samples, law
counterexamples, a theory's counterexample); `transitions_in` reads them all, so any policy's data
counts the same. A table hypothesis at period p is *consistent* when no (class, window) pair was
seen going to two symbols, and *complete* when every pair was seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from universe.instruments import windows
from universe.symbols import SYMBOLS, WINDOWS, encode

Pair = tuple[str, str]


@dataclass
class TableView:
    """What the evidence says about the table at one period."""

    period: int
    counts: np.ndarray  # int [period, 64, 4]: how often (class, window) went to each symbol

    @property
    def seen(self) -> np.ndarray:
        return cast(np.ndarray, self.counts.sum(axis=2) > 0)  # numpy types a sum over an axis as Any

    @property
    def conflicts(self) -> int:
        """(class, window) pairs seen going to more than one symbol."""
        return int(((self.counts > 0).sum(axis=2) > 1).sum())

    @property
    def consistent(self) -> bool:
        return self.conflicts == 0

    @property
    def complete(self) -> bool:
        return bool(self.seen.all())

    @property
    def coverage(self) -> float:
        return float(self.seen.mean())

    def table(self, unknown: str = "?") -> list[str]:
        """One 64-symbol string per class; the most seen symbol, `unknown` where nothing was seen."""
        best = self.counts.argmax(axis=2)
        return ["".join(SYMBOLS[int(s)] if seen else unknown for s, seen in zip(row, seen_row))
                for row, seen_row in zip(best, self.seen)]


@dataclass
class Evidence:
    pairs: list[Pair] = field(default_factory=list)
    _known: set[Pair] = field(default_factory=set, repr=False)

    def add(self, before: str, after: str) -> bool:
        """Record one transition on a ring; False if it was already known or malformed."""
        if not before or len(before) != len(after) or (before, after) in self._known:
            return False
        if not set(before) <= set(SYMBOLS) or not set(after) <= set(SYMBOLS):
            return False
        self._known.add((before, after))
        self.pairs.append((before, after))
        return True

    def add_result(self, name: str, arguments: dict[str, Any], result: dict[str, Any]) -> int:
        """Harvest a tool result; returns how many new transitions it gave."""
        return sum(self.add(a, b) for a, b in transitions_in(name, arguments, result))

    def view(self, period: int) -> TableView:
        counts = np.zeros((period, WINDOWS, len(SYMBOLS)), dtype=np.int64)
        for before, after in self.pairs:
            cells = encode(before)
            classes = np.arange(cells.shape[0]) % period
            np.add.at(counts, (classes, windows(cells), encode(after)), 1)
        return TableView(period, counts)

    @property
    def cells(self) -> int:
        return sum(len(before) for before, _ in self.pairs)

    def to_json(self) -> list[list[str]]:
        return [[a, b] for a, b in self.pairs]

    @classmethod
    def from_json(cls, data: list[list[str]]) -> Evidence:
        evidence = cls()
        for before, after in data:
            evidence.add(before, after)
        return evidence


def transitions_in(name: str, arguments: dict[str, Any], result: dict[str, Any]) -> list[Pair]:
    """The true one-step transitions a harness tool's result shows."""
    if not isinstance(result, dict) or "error" in result:
        return []
    found: list[Pair] = []
    if name == "run_prediction":
        if result.get("result") == "PASS":  # the prediction was the truth
            found.append((arguments.get("state_t0", ""), arguments.get("predicted_t1", "")))
        else:
            found += _steps(result.get("counterexample", {}).get("trajectory"))
    elif name == "request_samples":
        for sample in result.get("samples", []):
            found += _steps(sample.get("trajectory"))
    elif name == "evaluate_laws":
        for verdict in result.get("results", []):
            found += _steps((verdict.get("counterexample") or {}).get("trajectory"))
    elif name == "submit_theory":
        miss = result.get("counterexample")
        if isinstance(miss, dict):
            found.append((miss.get("state", ""), miss.get("true_next", "")))
    return [(a, b) for a, b in found if isinstance(a, str) and isinstance(b, str)]


def _steps(trajectory: Any) -> list[Pair]:
    if not isinstance(trajectory, list) or not all(isinstance(row, str) for row in trajectory):
        return []
    return list(zip(trajectory, trajectory[1:]))
