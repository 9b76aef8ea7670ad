"""Judging laws over a batch of trajectories: the first violation of each law (violations.py), cut
down to a small counterexample (shrink.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from universe.laws.ast import Law, parse_law
from universe.laws.shrink import counterexample
from universe.laws.violations import violations
from universe.rule import Rule
from universe.symbols import check_codes


def evaluate_laws(laws: Sequence[dict[str, Any] | Law], trajectories: np.ndarray | Sequence[np.ndarray],
                  rule: Rule | None = None, shrink: bool = True) -> list[dict[str, Any]]:
    """Judge every law on every trajectory batch (`uint8 [T+1, B, L]`; one array or a list of them,
    e.g. one per grid length). Returns, per law, `{"law": index, "name", "status": "PASS" | "FAIL",
    "counterexample": {...} | None}`. `rule` is needed for symmetry laws and to shrink counterexamples
    (re-simulating smaller grids); without it a counterexample is the failing slice as given."""
    parsed = [parse_law(law, f"laws[{k}]") for k, law in enumerate(laws)]
    batches = _check_batches(trajectories)
    results = []
    for k, law in enumerate(parsed):
        if law.kind == "symmetry" and rule is None:
            raise ValueError(f"laws[{k}]: a symmetry law needs the rule to step transformed states")
        found = None
        for traj in batches:
            if traj.shape[0] <= law.reach:
                raise ValueError(f"laws[{k}] looks {law.reach} steps ahead but a trajectory has "
                                 f"{traj.shape[0] - 1} steps")
            broken = violations(law, traj, rule)
            if broken.any():
                t, b = (int(v) for v in np.argwhere(broken)[0])
                found = counterexample(law, traj, t, b, rule, shrink)
                break
        results.append({"law": k, "name": law.name, "status": "FAIL" if found else "PASS",
                        "counterexample": found})
    return results


def _check_batches(trajectories: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    batches = [trajectories] if isinstance(trajectories, np.ndarray) else list(trajectories)
    if not batches:
        raise ValueError("no trajectories to judge laws on")
    for traj in batches:
        if not isinstance(traj, np.ndarray) or traj.ndim != 3 or traj.dtype != np.uint8 or 0 in traj.shape:
            raise ValueError("trajectories must be non-empty uint8 arrays [T+1, B, L]")
        check_codes(traj)
    return batches
