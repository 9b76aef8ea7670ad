"""An expression of the law language evaluated over a batch of trajectories at once (numpy, vectorised
over time, grids and cells).

numpy's stubs type comparisons, reductions and ufunc reductions as Any; `cast` says what they give."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np

from universe.instruments import windows
from universe.laws.ast import BOOL, CELL, Expr


def evaluate(expr: Expr, traj: np.ndarray) -> np.ndarray:
    """An expression's values: `[T+1-reach, B]` (global) or broadcastable to `[T+1-reach, B, L]` (cell);
    row t is the value at time t. Integers are int64, booleans bool."""
    rows, grids, length = traj.shape[0] - expr.reach, traj.shape[1], traj.shape[2]
    op = expr.op
    if op == "const":
        return np.full((rows, grids), bool(expr.value) if expr.type == BOOL else expr.value)
    if op == "count":
        return cast(np.ndarray, (traj == expr.value).sum(axis=-1, dtype=np.int64))
    if op == "count_pattern":
        return cast(np.ndarray, _pattern_hits(traj, expr.pattern, 0).sum(axis=-1, dtype=np.int64))
    if op == "matches":
        return _pattern_hits(traj, expr.pattern, -(len(expr.pattern) // 2))
    if op == "length":
        return np.full((rows, grids), length, dtype=np.int64)
    if op == "transition_indicator":
        return cast(np.ndarray, (traj[1:] != traj[:-1]).sum(axis=-1, dtype=np.int64))
    if op == "changed":
        return cast(np.ndarray, traj[1:] != traj[:-1])
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
        return cast(np.ndarray, combine.reduce([inner[k:k + rows] for k in range(expr.value + 1)]))
    if op in ("sum", "all_cells", "any_cells"):
        inner = np.broadcast_to(evaluate(expr.args[0], traj), (rows, grids, length))
        return cast(np.ndarray, {"sum": lambda a: a.sum(axis=-1, dtype=np.int64),
                                 "all_cells": lambda a: a.all(axis=-1),
                                 "any_cells": lambda a: a.any(axis=-1)}[op](inner))
    args = [_align(evaluate(a, traj), rows, expr.scope == CELL) for a in expr.args]
    return _COMBINE[op](args)


def _align(value: np.ndarray, rows: int, cell: bool) -> np.ndarray:
    # Trim to the rows the parent is defined on; give global values a cell axis to broadcast over.
    value = value[:rows]
    return value[..., None] if cell and value.ndim == 2 else value


_COMBINE: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {
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
