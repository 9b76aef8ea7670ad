"""Experiment design: one ring that shows every (window, coordinate class) pair exactly once.

A cell's next symbol depends on its window (left, centre, right) and its class i mod P. To read the
whole table from one `run_prediction` we need a ring where every window sits at every phase
i mod M (M a multiple of P). Walk the de Bruijn graph of symbol pairs crossed with the phase cycle:
node (a, b, phi) says "cell i-1 holds a, cell i holds b, i mod M = phi"; its four out-edges
(a, b, phi) -> (b, c, phi+1) are exactly the windows abc centred on a cell of phase phi. Every node
has in-degree = out-degree = 4 and the graph is strongly connected (the pair graph has self-loops, so
its cycle lengths are coprime with any M), hence an Eulerian circuit exists: 64*M edges, each
(window, phase) once. Read as a ring of 64*M cells starting at phase 0, the circuit is the design.
For M = 2 that is the 128-cell ring of the design notes; M = 6 covers periods 1, 2, 3 and 6 at once.
"""

from __future__ import annotations

from math import lcm

import numpy as np

from universe.instruments import windows
from universe.symbols import SYMBOLS, WINDOWS, decode

MAX_RING = 4096  # the harness's longest state (universe.harness.MAX_STATE)
MAX_MODULUS = MAX_RING // WINDOWS


def coverage_ring(modulus: int) -> str:
    """A ring of 64*modulus cells holding every (window, i mod modulus) pair exactly once."""
    if not 1 <= modulus <= MAX_MODULUS:
        raise ValueError(f"modulus must be in 1..{MAX_MODULUS}, got {modulus}")
    symbols = len(SYMBOLS)
    # next_edge[node] = the next unused out-symbol c of node (a, b, phi), tried in order 0..3.
    next_edge = np.zeros((symbols, symbols, modulus), dtype=np.int64)
    # Hierholzer, iteratively: walk unused edges, back off when stuck, emit nodes in reverse.
    start = (0, 0, 0)
    stack, circuit = [start], []
    while stack:
        a, b, phi = stack[-1]
        c = next_edge[a, b, phi]
        if c < symbols:
            next_edge[a, b, phi] += 1
            stack.append((b, int(c), (phi + 1) % modulus))
        else:
            circuit.append(stack.pop())
    circuit.reverse()  # nodes n_0 .. n_L with n_L == n_0; n_i's second symbol is cell i
    cells = np.array([b for _, b, _ in circuit[:-1]], dtype=np.uint8)
    return decode(cells)


def design_modulus(period: int, covered: int) -> int:
    """The modulus of the next ring: one that also covers `period`, grown from what earlier rings
    covered while it fits in one state; else the period alone."""
    wanted = lcm(covered, period)
    return wanted if wanted <= MAX_MODULUS else period


def pair_counts(ring: str, modulus: int) -> np.ndarray:
    """`int [modulus, 64]`: how often each (class, window) pair occurs in the ring (for checks)."""
    from universe.symbols import encode

    cells = encode(ring)
    counts = np.zeros((modulus, WINDOWS), dtype=np.int64)
    np.add.at(counts, (np.arange(cells.shape[0]) % modulus, windows(cells)), 1)
    return counts
