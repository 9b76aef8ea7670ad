"""Small counterexamples: a failing trajectory cut down to the fewest cells and steps that still fail.

Steps: violations are local in time (violations.py), so the trajectory restarts at the state where the
violation begins and runs only the law's reach. Cells: every cyclic window of that state, shortest
first, is re-simulated as a ring of its own; the first that still breaks the law is kept. Whatever is
returned is a genuine trajectory of the rule that breaks the law at t = 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from universe.instruments import neighbor_config
from universe.laws.ast import Law
from universe.laws.values import evaluate
from universe.laws.violations import cell_violations, step_once, transform, violations
from universe.rule import Rule
from universe.simulate import simulate
from universe.symbols import decode


def counterexample(law: Law, traj: np.ndarray, t: int, b: int, rule: Rule | None,
                   shrink: bool = True) -> dict[str, Any]:
    if rule is None:
        rows = traj[t:t + law.reach + 1, b]
    else:
        state = smallest_failing(law, traj[t, b], rule) if shrink else traj[t, b]
        rows = _simulate(state[None, :], rule, law.reach)[:, 0]
    return describe(law, rows, rule)


def smallest_failing(law: Law, state: np.ndarray, rule: Rule) -> np.ndarray:
    length = state.shape[0]
    for size in range(1, length):
        # All cyclic windows of `size` cells (as new rings), de-duplicated.
        cut = (np.arange(length)[:, None] + np.arange(size)[None, :]) % length
        candidates = np.unique(state[cut], axis=0)
        broken = violations(law, _simulate(candidates, rule, law.reach), rule)[0]
        if broken.any():
            smallest: np.ndarray = candidates[int(np.argmax(broken))]
            return smallest
    return state


def describe(law: Law, rows: np.ndarray, rule: Rule | None) -> dict[str, Any]:
    """The counterexample as the agent sees it: the trajectory, and where and how it breaks the law."""
    traj = rows[:, None, :]
    cells = cell_violations(law, traj, rule)[0, 0]
    found: dict[str, Any] = {"trajectory": [decode(r) for r in rows], "t": 0}
    if law.kind in ("invariant", "monotone"):
        assert law.expr is not None  # every kind but symmetry has one
        value = evaluate(law.expr, traj)[:2, 0]
        found["detail"] = {"value_at_t": int(value[0]), "value_at_t+1": int(value[1])}
    elif law.kind == "symmetry":
        assert rule is not None  # evaluate_laws refuses a symmetry law without the rule
        moved = transform(law, rows[:2])
        found["detail"] = {"transformed": [decode(r) for r in moved],
                           "stepped_after_transform": decode(step_once(moved[:1], rule)[0]),
                           "cells": [int(i) for i in np.flatnonzero(cells)]}
    elif cells.shape[0] > 1 or (law.expr is not None and law.expr.scope == "cell"):
        cell = int(np.argmax(cells))
        found["cell"] = cell
        found["detail"] = {"neighbor_config": neighbor_config(rows[0], cell)}
    return found


def _simulate(states: np.ndarray, rule: Rule, steps: int) -> np.ndarray:
    # The reference backend: these batches are tiny, and it needs no JIT warm-up.
    return simulate(states, rule, steps, backend="numpy")
