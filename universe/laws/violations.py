"""Where a law is broken, over a batch of trajectories at once (numpy, vectorised over time, grids and
cells).

Every law is checked as a violation that is local in time: a law of reach R is broken at time t when
rows t..t+R of one trajectory break it (an invariant: the quantity differs between t and t+1). So a
violation found at t is reproduced by the trajectory that starts at the state of time t, which is how
counterexamples are shrunk (shrink.py).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from universe.laws.ast import CELL, Law
from universe.laws.values import evaluate
from universe.rule import Rule
from universe.simulate import simulate


def violations(law: Law, traj: np.ndarray, rule: Rule | None) -> np.ndarray:
    """`bool [T+1-reach, B]`: where the law is broken, by time and grid."""
    return cast(np.ndarray, cell_violations(law, traj, rule).any(axis=-1))


def cell_violations(law: Law, traj: np.ndarray, rule: Rule | None) -> np.ndarray:
    """`bool [T+1-reach, B, L]` for cell-scoped laws; `[T+1-reach, B, 1]` for global ones."""
    rows, grids, length = traj.shape[0] - law.reach, traj.shape[1], traj.shape[2]
    if law.kind == "symmetry":
        assert rule is not None  # evaluate_laws refuses a symmetry law without the rule
        seen = transform(law, traj)
        stepped = step_once(transform(law, traj[:-1]).reshape(-1, length), rule).reshape(rows, grids, length)
        return cast(np.ndarray, stepped != seen[1:])
    assert law.expr is not None  # every kind but symmetry has one
    value = evaluate(law.expr, traj)
    if law.kind in ("invariant", "monotone"):
        before, after = value[:-1], value[1:]
        broken = {"invariant": after != before, "nondecreasing": after < before,
                  "nonincreasing": after > before}[law.direction or law.kind]
        return cast(np.ndarray, broken[..., None])
    if law.expr.scope == CELL:
        return ~np.broadcast_to(value, (rows, grids, length))
    return ~value[..., None]


def step_once(states: np.ndarray, rule: Rule) -> np.ndarray:
    next_states: np.ndarray = simulate(states, rule, 1, backend="numpy")[1]
    return next_states


def transform(law: Law, states: np.ndarray) -> np.ndarray:
    """A symmetry law's transformation: relabel, then mirror, then rotate (last axis is the ring)."""
    out = np.asarray(law.permute, dtype=np.uint8)[states]
    if law.reflect:
        out = out[..., ::-1]
    return np.roll(out, law.shift, axis=-1) if law.shift else np.ascontiguousarray(out)
