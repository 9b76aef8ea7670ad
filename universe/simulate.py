"""`simulate(states, rule, steps, backend)`: one entry point, four backends with identical results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from universe.device import gpu_available
from universe.rule import Rule, load_rule
from universe.symbols import as_batch

BACKENDS = ("auto", "numpy", "numba", "triton")


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "auto":
        return "triton" if gpu_available() else "numba"
    return backend


def simulate(states: str | Sequence[str] | np.ndarray, rule: Rule | str | dict[str, Any], steps: int,
             backend: str = "auto") -> np.ndarray:
    """Advance `states` (`uint8 [B, L]` or one string) `steps` times under `rule`.

    Returns `uint8 [steps+1, B, L]`; row 0 is the input."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
        raise ValueError(f"steps must be an integer, got {steps!r}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    rule = load_rule(rule)
    batch = as_batch(states)
    name = resolve_backend(backend)
    if name == "numpy":
        from universe import numpy_backend

        trajectory = np.empty((int(steps) + 1, *batch.shape), dtype=np.uint8)
        trajectory[0] = batch
        numpy_backend.run(trajectory, rule.lut)
        return trajectory
    if name == "numba":
        from universe import numba_backend

        return numba_backend.simulate(batch, rule.lut, int(steps))
    from universe import triton_backend

    return triton_backend.simulate(batch, rule.lut, int(steps))
