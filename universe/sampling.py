"""Where test states come from: random rings of varied density, and de Bruijn rings that hold every
(window, coordinate class) pair."""

from __future__ import annotations

import numpy as np

from universe.symbols import SYMBOLS


def random_states(rng: np.random.Generator, count: int, length: int) -> np.ndarray:
    """`uint8 [count, length]`; each ring draws its own density of non-blank cells in [0.05, 0.95],
    so sparse rings (lone particles) and crowded ones (collisions) both occur."""
    density = rng.uniform(0.05, 0.95, size=(count, 1))
    occupied = rng.random((count, length)) < density
    particles = rng.integers(1, len(SYMBOLS), size=(count, length), dtype=np.uint8)
    return np.where(occupied, particles, 0).astype(np.uint8)


def de_bruijn(alphabet: int = len(SYMBOLS), order: int = 3) -> np.ndarray:
    """The de Bruijn sequence B(alphabet, order): read as a ring, each window occurs exactly once."""
    word = [0] * (alphabet * order)
    out: list[int] = []

    def extend(t: int, p: int) -> None:
        # The standard Lyndon-word construction (Fredricksen, Kessler, Maiorana).
        if t > order:
            if order % p == 0:
                out.extend(word[1:p + 1])
            return
        word[t] = word[t - p]
        extend(t + 1, p)
        for symbol in range(word[t - p] + 1, alphabet):
            word[t] = symbol
            extend(t + 1, t)

    extend(1, 1)
    return np.array(out, dtype=np.uint8)


def coverage_states() -> np.ndarray:
    """`uint8 [64, 64]`: the 64 rotations of the de Bruijn ring. Every window sits at every position
    0..63 in one of them, so every (window, class) pair occurs for any period up to 64."""
    ring = de_bruijn()
    return np.stack([np.roll(ring, -shift) for shift in range(ring.shape[0])])


def plant(rng: np.random.Generator, pattern: str, count: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Random rings with `pattern` ('.' = any symbol) written at a random position of each.

    Returns the states and where each pattern starts."""
    states = random_states(rng, count, length)
    starts = rng.integers(0, length, size=count)
    for k, symbol in enumerate(pattern):
        if symbol != ".":
            states[np.arange(count), (starts + k) % length] = SYMBOLS.index(symbol)
    return states, starts
