"""The alphabet `_ABK` (codes 0-3) and the two ways to hold states: strings and `uint8` arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SYMBOLS = "_ABK"
CODES = {symbol: code for code, symbol in enumerate(SYMBOLS)}
# A window packs (left, centre, right) into one number, the index into a rule table row.
WINDOWS = 64


def _byte_to_code() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint8)
    for code, symbol in enumerate(SYMBOLS):
        table[ord(symbol)] = code
    return table


# A byte lookup is ~100x faster than a per-character dict on long states (read-only constant).
_BYTE_TO_CODE = _byte_to_code()
_BYTE_TO_CODE.flags.writeable = False


def encode(state: str) -> np.ndarray:
    """One state string → `uint8 [L]`."""
    if not isinstance(state, str):
        raise ValueError(f"a state must be a string over {SYMBOLS}, got {type(state).__name__}")
    if not state:
        raise ValueError("empty grid: a state needs at least one cell")
    if not set(state) <= CODES.keys():
        i, ch = next((i, ch) for i, ch in enumerate(state) if ch not in CODES)
        raise ValueError(f"symbol {ch!r} at cell {i} is outside {SYMBOLS}")
    return _BYTE_TO_CODE[np.frombuffer(state.encode("ascii"), dtype=np.uint8)]


def decode(cells: np.ndarray) -> str:
    """`uint8 [L]` → one state string."""
    cells = np.asarray(cells)
    if cells.ndim != 1:
        raise ValueError(f"decode takes one state (1-D), got shape {cells.shape}")
    check_codes(cells)
    text: str = np.frombuffer(SYMBOLS.encode("ascii"), dtype=np.uint8)[cells].tobytes().decode("ascii")
    return text


def check_codes(cells: np.ndarray) -> None:
    """Raise if any code is outside 0-3, naming where."""
    if cells.size and int(cells.max(initial=0)) >= len(SYMBOLS):
        where = tuple(int(i) for i in np.argwhere(cells >= len(SYMBOLS))[0])
        raise ValueError(f"symbol code {int(cells[where])} at {where} is outside {SYMBOLS} (codes 0-3)")


def as_batch(states: str | Sequence[str] | np.ndarray) -> np.ndarray:
    """One string, a list of equal-length strings, or an array → a checked `uint8 [B, L]` copy."""
    if isinstance(states, str):
        return encode(states)[None, :]
    if isinstance(states, (list, tuple)) and states and all(isinstance(s, str) for s in states):
        rows = [encode(s) for s in states]
        if len({len(r) for r in rows}) != 1:
            raise ValueError("the states of one batch must all have the same length")
        return np.stack(rows)
    array = np.asarray(states)
    if array.dtype.kind not in "iu":
        raise ValueError(f"states must be strings or an integer array, got dtype {array.dtype}")
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise ValueError(f"states must have shape [B, L], got {array.shape}")
    if array.shape[0] == 0:
        raise ValueError("empty batch: no states given")
    if array.shape[1] == 0:
        raise ValueError("empty grid: a state needs at least one cell")
    if array.dtype.kind == "i" and int(array.min()) < 0:
        raise ValueError(f"symbol code {int(array.min())} is outside {SYMBOLS} (codes 0-3)")
    check_codes(array)
    return np.array(array, dtype=np.uint8, order="C", copy=True)


def window_string(index: int) -> str:
    """Rule-table index → its three symbols, e.g. 18 → 'A_B'."""
    if not 0 <= index < WINDOWS:
        raise ValueError(f"window index {index} is outside 0-63")
    return SYMBOLS[index >> 4] + SYMBOLS[(index >> 2) & 3] + SYMBOLS[index & 3]
