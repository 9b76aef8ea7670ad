"""The agent's microscope: neighbourhoods, coordinate classes, the activity scalar.

The grid is a ring: cell i's left neighbour is (i-1) mod L, so on a one-cell ring a cell is its own
left and right neighbour.
"""

from __future__ import annotations

import numpy as np

from universe.symbols import as_batch, decode


def neighbor_config(state: str | np.ndarray, i: int) -> str:
    """The (left, centre, right) symbols around cell i, e.g. 'A_B'."""
    cells = as_batch(state)
    if cells.shape[0] != 1:
        raise ValueError("neighbor_config takes one state")
    row = cells[0]
    length = row.shape[0]
    if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
        raise ValueError(f"cell index must be an integer, got {i!r}")
    i = int(i) % length
    return decode(row[[(i - 1) % length, i, (i + 1) % length]])


def windows(states: np.ndarray) -> np.ndarray:
    """Every cell's window index 16*left + 4*centre + right, same shape as `states` (last axis = ring)."""
    left = np.roll(states, 1, axis=-1)
    right = np.roll(states, -1, axis=-1)
    # Codes are < 4, so the packed index (< 64) fits in uint8.
    packed: np.ndarray = (left << 4) | (states << 2) | right
    return packed


def coordinate_class(i: int | np.ndarray, period: int) -> int | np.ndarray:
    """Which of the `period` classes cell i is in: i mod period."""
    if isinstance(period, bool) or not isinstance(period, (int, np.integer)) or period < 1:
        raise ValueError(f"period must be a positive integer, got {period!r}")
    return np.mod(i, period) if isinstance(i, np.ndarray) else int(i) % int(period)


def transition_indicator(prev: str | np.ndarray, nxt: str | np.ndarray) -> int | np.ndarray:
    """How many cells changed between two states: an int for one state, `[B]` for a batch."""
    a, b = as_batch(prev), as_batch(nxt)
    if a.shape != b.shape:
        raise ValueError(f"transition_indicator needs states of one shape, got {a.shape} and {b.shape}")
    counts = (a != b).sum(axis=-1)
    one = isinstance(prev, str) or np.asarray(prev).ndim == 1
    return int(counts[0]) if one else counts

