"""Per-turn figures for the progress display and the report.

The referee knows the hidden rule (it is the experimenter's bookkeeping, never shown to the policy):
`coverage` is the share of the true rule's (window, class) pairs the run has seen a transition for;
`accuracy` is how many of a fixed set of random states the policy's current theory steps exactly
right, the same states every turn so the curve is comparable. Neither costs an experiment.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from agent.evidence import Evidence
from universe.rule import Rule
from universe.sampling import random_states
from universe.simulate import simulate

REFEREE_LENGTHS = (7, 16, 31, 64)
REFEREE_PER_LENGTH = 128


@dataclass
class TurnMetrics:
    turn: int
    experiments: int
    predictions_checked: int
    cells_observed: int
    coverage: float
    accuracy: float
    compactions: int
    tools: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    first_changed_block: str | None = None
    wall_s: float = 0.0

    @property
    def hit_ratio(self) -> float | None:
        if not self.prompt_tokens:
            return None
        assert self.cached_tokens is not None  # both come from the same usage, or neither
        return self.cached_tokens / self.prompt_tokens

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Referee:
    def __init__(self, rule: Rule, seed: int = 12345) -> None:
        self.rule = rule
        rng = np.random.default_rng(seed)
        self.states = [random_states(rng, REFEREE_PER_LENGTH, n) for n in REFEREE_LENGTHS]
        self.truth = [simulate(s, rule, 1, "numpy")[1] for s in self.states]

    def coverage(self, evidence: Evidence) -> float:
        return evidence.view(self.rule.period).coverage if evidence.pairs else 0.0

    def accuracy(self, table: list[str] | None) -> float:
        """Share of the fixed states the table steps exactly right (unknown entries count as '_')."""
        theory = _as_rule(table)
        if theory is None:
            return 0.0
        right = sum(int((simulate(s, theory, 1, "numpy")[1] == t).all(axis=1).sum())
                    for s, t in zip(self.states, self.truth))
        return right / sum(int(s.shape[0]) for s in self.states)


def _as_rule(table: list[str] | None) -> Rule | None:
    if not table or not isinstance(table, list):
        return None
    try:
        rows = tuple("".join(ch if ch in "_ABK" else "_" for ch in str(row)).ljust(64, "_")[:64] for row in table)
        return Rule("theory", len(rows), rows)
    except ValueError:
        return None
