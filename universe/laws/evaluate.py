"""Judging laws over a batch of trajectories at once (numpy, vectorised over time, grids and cells).

Every law is checked as a violation that is local in time: a law of reach R is broken at time t when
rows t..t+R of one trajectory break it (an invariant: the quantity differs between t and t+1). So a
violation found at t is reproduced by the trajectory that starts at the state of time t, which is how
counterexamples are shrunk (shrink.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from universe.instruments import windows
from universe.laws.ast import BOOL, CELL, Expr, Law, parse_law
from universe.rule import Rule
from universe.symbols import check_codes


def evaluate_laws(laws: Sequence[dict | Law], trajectories: np.ndarray | Sequence[np.ndarray],
                  rule: Rule | None = None, shrink: bool = True) -> list[dict[str, Any]]:
    """Judge every law on every trajectory batch (`uint8 [T+1, B, L]`; one array or a list of them,
    e.g. one per grid length). Returns, per law, `{"law": index, "name", "status": "PASS" | "FAIL",
    "counterexample": {...} | None}`. `rule` is needed for symmetry laws and to shrink counterexamples
    (re-simulating smaller grids); without it a counterexample is the failing slice as given."""
    from universe.laws.shrink import counterexample

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


def violations(law: Law, traj: np.ndarray, rule: Rule | None) -> np.ndarray:
    """`bool [T+1-reach, B]`: where the law is broken, by time and grid."""
    return cell_violations(law, traj, rule).any(axis=-1)


def cell_violations(law: Law, traj: np.ndarray, rule: Rule | None) -> np.ndarray:
    """`bool [T+1-reach, B, L]` for cell-scoped laws; `[T+1-reach, B, 1]` for global ones."""
    rows, grids, length = traj.shape[0] - law.reach, traj.shape[1], traj.shape[2]
    if law.kind == "symmetry":
        seen = transform(law, traj)
        stepped = step_once(transform(law, traj[:-1]).reshape(-1, length), rule).reshape(rows, grids, length)
        return stepped != seen[1:]
    value = evaluate(law.expr, traj)
    if law.kind in ("invariant", "monotone"):
        before, after = value[:-1], value[1:]
        broken = {"invariant": after != before, "nondecreasing": after < before,
                  "nonincreasing": after > before}[law.direction or law.kind]
        return broken[..., None]
    if law.expr.scope == CELL:
        return ~np.broadcast_to(value, (rows, grids, length))
    return ~value[..., None]


def step_once(states: np.ndarray, rule: Rule) -> np.ndarray:
    from universe.simulate import simulate

    return simulate(states, rule, 1, backend="numpy")[1]


def transform(law: Law, states: np.ndarray) -> np.ndarray:
    """A symmetry law's transformation: relabel, then mirror, then rotate (last axis is the ring)."""
    out = np.asarray(law.permute, dtype=np.uint8)[states]
    if law.reflect:
        out = out[..., ::-1]
    return np.roll(out, law.shift, axis=-1) if law.shift else np.ascontiguousarray(out)


def evaluate(expr: Expr, traj: np.ndarray) -> np.ndarray:
    """An expression's values: `[T+1-reach, B]` (global) or broadcastable to `[T+1-reach, B, L]` (cell);
    row t is the value at time t. Integers are int64, booleans bool."""
    rows, grids, length = traj.shape[0] - expr.reach, traj.shape[1], traj.shape[2]
    op = expr.op
    if op == "const":
        return np.full((rows, grids), bool(expr.value) if expr.type == BOOL else expr.value)
    if op == "count":
        return (traj == expr.value).sum(axis=-1, dtype=np.int64)
    if op == "count_pattern":
        return _pattern_hits(traj, expr.pattern, 0).sum(axis=-1, dtype=np.int64)
    if op == "matches":
        return _pattern_hits(traj, expr.pattern, -(len(expr.pattern) // 2))
    if op == "length":
        return np.full((rows, grids), length, dtype=np.int64)
    if op == "transition_indicator":
        return (traj[1:] != traj[:-1]).sum(axis=-1, dtype=np.int64)
    if op == "changed":
        return traj[1:] != traj[:-1]
    if op == "cell":
        return np.roll(traj, -expr.value, axis=-1).astype(np.int64)
    if op == "neighbor_config":
        return windows(traj).astype(np.int64)
    if op == "coordinate_class":
        return np.broadcast_to(np.arange(length, dtype=np.int64) % expr.value, (rows, grids, length))
    if op in ("at", "next"):
        return evaluate(expr.args[0], traj)[expr.value:]
    if op in ("always", "eventually"):
        inner = evaluate(expr.args[0], traj)
        combine = np.logical_and if op == "always" else np.logical_or
        return combine.reduce([inner[k:k + rows] for k in range(expr.value + 1)])
    if op in ("sum", "all_cells", "any_cells"):
        inner = np.broadcast_to(evaluate(expr.args[0], traj), (rows, grids, length))
        return {"sum": lambda a: a.sum(axis=-1, dtype=np.int64), "all_cells": lambda a: a.all(axis=-1),
                "any_cells": lambda a: a.any(axis=-1)}[op](inner)
    args = [_align(evaluate(a, traj), rows, expr.scope == CELL) for a in expr.args]
    return _COMBINE[op](args)


def _align(value: np.ndarray, rows: int, cell: bool) -> np.ndarray:
    # Trim to the rows the parent is defined on; give global values a cell axis to broadcast over.
    value = value[:rows]
    return value[..., None] if cell and value.ndim == 2 else value


_COMBINE = {
    "add": lambda a: sum(a[1:], a[0]),
    "mul": lambda a: np.prod(np.broadcast_arrays(*a), axis=0),
    "sub": lambda a: a[0] - a[1],
    "mod": lambda a: np.mod(a[0], a[1]),
    "neg": lambda a: -a[0],
    "abs": lambda a: np.abs(a[0]),
    "eq": lambda a: a[0] == a[1],
    "ne": lambda a: a[0] != a[1],
    "lt": lambda a: a[0] < a[1],
    "le": lambda a: a[0] <= a[1],
    "gt": lambda a: a[0] > a[1],
    "ge": lambda a: a[0] >= a[1],
    "and": lambda a: np.logical_and.reduce(np.broadcast_arrays(*a)),
    "or": lambda a: np.logical_or.reduce(np.broadcast_arrays(*a)),
    "not": lambda a: ~a[0],
    "implies": lambda a: ~a[0] | a[1],
}


def _pattern_hits(traj: np.ndarray, pattern: tuple[int, ...], start: int) -> np.ndarray:
    """`bool [T+1, B, L]`: the pattern read cyclically from cell i+start matches ('.' = -1 = any)."""
    hits = np.ones(traj.shape, dtype=bool)
    for k, code in enumerate(pattern):
        if code >= 0:
            hits &= np.roll(traj, -(start + k), axis=-1) == code
    return hits
