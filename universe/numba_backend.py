"""The CPU fast path: a bit-sliced, multi-threaded numba kernel.

Why bit-slicing: a table lookup per cell runs at ~1e9 cells/s at best, because every cell costs a
dependent load. Instead a symbol's two bits are kept in two bit-planes of `uint64` words, 64 cells a
word, and the rule becomes a Boolean function of six planes (left, centre, right × 2 bits) evaluated
as a 64-leaf multiplexer tree (~140 bit-ops per output plane advance 64 cells at once). The leaves
are per-bit-position masks, so one word can mix coordinate classes; a word's leaves depend only on
`64*w mod period`, i.e. on `w mod Q` with `Q = period / gcd(64, period)`. The tree's first level is
folded into the leaves ahead of time (see `leaves`), which cuts a quarter of the bit-ops.

Layout: each thread takes a chunk of up to 128 grids and keeps their planes as `[word, grid]`, so the
innermost loop runs across grids with uniform control flow, which LLVM vectorises (4 words per AVX2
register). Each step's planes are unpacked to bytes (8 cells per `uint64` store) into the trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numba as nb  # type: ignore[import-untyped, unused-ignore]  # numba ships no annotations (some builds do)
import numpy as np

if TYPE_CHECKING:
    _Kernel = TypeVar("_Kernel", bound=Callable[..., Any])

    def njit(**options: Any) -> Callable[[_Kernel], _Kernel]:
        """numba.njit as a type checker should see it: the compiled function keeps its signature."""
else:
    njit = nb.njit

U64 = np.uint64
MAX_CHUNK = 128  # grids per thread task: their planes (a few words each) stay in L1/L2


def leaves(lut: np.ndarray) -> np.ndarray:
    """`[Q, 2, 64] uint64`, the rule as multiplexer leaves for word phase q and output bit b.

    Plain leaf `m[q, b, window]` has bit j set when bit b of the next symbol is set for cell j of a
    word whose first cell has class `64*q mod period`. Each group of four (a, b, c, d) = windows
    4k..4k+3, selected by the right cell's bits (r1 r0), is stored as (a, a^b, a^c, a^b^c^d), so that
    `_quad` selects among them in 6 bit-ops instead of 9."""
    period = lut.shape[0]
    phases = period // math.gcd(64, period)
    bit = np.arange(64)
    classes = (64 * np.arange(phases)[:, None] + bit[None, :]) % period        # [Q, 64 cells]
    symbols = lut[classes]                                                     # [Q, 64 cells, 64 windows]
    planes = np.stack([(symbols >> b) & 1 for b in range(2)], axis=1).astype(U64)  # [Q, 2, cell, window]
    plain = (planes << bit[None, None, :, None].astype(U64)).sum(axis=2, dtype=U64)
    a, b, c, d = (plain[..., k::4] for k in range(4))
    folded: np.ndarray = np.empty_like(plain)
    folded[..., 0::4] = a
    folded[..., 1::4] = a ^ b
    folded[..., 2::4] = a ^ c
    folded[..., 3::4] = a ^ b ^ c ^ d
    return folded


def _spread_table() -> np.ndarray:
    """Byte → uint64 with bit k moved to bit 0 of byte k: unpacks 8 cells of one plane at once."""
    bytes_ = np.arange(256, dtype=U64)
    # sum() of arrays is an array; its stub also allows the int 0 it starts from.
    return cast(np.ndarray, sum(((bytes_ >> U64(k)) & U64(1)) << U64(8 * k) for k in range(8))).astype(U64)


@njit(inline="always")
def _mux4(s0: np.uint64, s1: np.uint64, a: np.uint64, b: np.uint64, c: np.uint64, d: np.uint64) -> np.uint64:
    # Picks a/b/c/d by the selector bits (s1 s0) = 00/01/10/11, on all 64 lanes at once.
    x = a ^ ((a ^ b) & s0)
    y = c ^ ((c ^ d) & s0)
    return x ^ ((x ^ y) & s1)


@njit(inline="always")
def _quad(r0: np.uint64, r1: np.uint64, m: np.ndarray, o: int) -> np.uint64:
    # _mux4 over folded leaves (a, a^b, a^c, a^b^c^d): r1=0 gives a^(a^b)&r0, r1=1 gives c^(c^d)&r0.
    picked: np.uint64 = m[o] ^ (m[o + 1] & r0) ^ ((m[o + 2] ^ (m[o + 3] & r0)) & r1)
    return picked


@njit(inline="always")
def _block16(m: np.ndarray, o: int, r0: np.uint64, r1: np.uint64, c0: np.uint64, c1: np.uint64) -> np.uint64:
    # The 16 leaves of one left symbol: select on the right cell, then on the centre.
    return _mux4(c0, c1, _quad(r0, r1, m, o), _quad(r0, r1, m, o + 4), _quad(r0, r1, m, o + 8),
                 _quad(r0, r1, m, o + 12))


@njit(inline="always")
def _rule_plane(m: np.ndarray, l0: np.uint64, l1: np.uint64, c0: np.uint64, c1: np.uint64, r0: np.uint64,
                r1: np.uint64) -> np.uint64:
    # window = 16*left + 4*centre + right, so left picks the 16-leaf block.
    return _mux4(l0, l1, _block16(m, 0, r0, r1, c0, c1), _block16(m, 16, r0, r1, c0, c1),
                 _block16(m, 32, r0, r1, c0, c1), _block16(m, 48, r0, r1, c0, c1))


@njit(inline="never", cache=True)
def _advance_word(m0: np.ndarray, m1: np.ndarray, left0: np.ndarray, left1: np.ndarray, mid0: np.ndarray,
                  mid1: np.ndarray, right0: np.ndarray, right1: np.ndarray, out0: np.ndarray, out1: np.ndarray,
                  n: int, lsh: np.uint64, rsh: np.uint64) -> None:
    """One word position of `n` grids. Kept out of line: as its own function its array arguments do
    not alias the caller's, and LLVM vectorises the loop (inlined, it gave up: 3x slower).

    Bit 0 of the left plane comes from bit `lsh` of the previous word (63 inside the ring, the last
    cell's bit on word 0); bit `rsh` of the right plane comes from bit 0 of the next word (63 inside,
    the last cell's bit on the last word), so one branch-free formula serves every word."""
    one = U64(1)
    keep = ~(one << rsh)
    for g in range(n):
        c0 = mid0[g]
        c1 = mid1[g]
        l0 = (c0 << one) | ((left0[g] >> lsh) & one)
        l1 = (c1 << one) | ((left1[g] >> lsh) & one)
        r0 = ((c0 >> one) & keep) | ((right0[g] & one) << rsh)
        r1 = ((c1 >> one) & keep) | ((right1[g] & one) << rsh)
        out0[g] = _rule_plane(m0, l0, l1, c0, c1, r0, r1)
        out1[g] = _rule_plane(m1, l0, l1, c0, c1, r0, r1)


@njit(inline="never", cache=True)
def _unpack(plane0: np.ndarray, plane1: np.ndarray, rows: np.ndarray, n: int, low: np.ndarray,
            high: np.ndarray) -> None:
    """Planes `[W, grid]` → `rows [grid, Lp/8]` as uint64, 8 cells a store: `low[byte]` spreads a
    byte of plane 0 to bit 0 of 8 bytes, `high[byte]` a byte of plane 1 to bit 1."""
    words = plane0.shape[0]
    chunks = rows.shape[1]
    full = min(words, chunks // 8)
    for g in range(n):
        for w in range(full):
            # Whole words: a fixed 8-store loop the compiler unrolls (2x faster than a bounded one).
            x0 = plane0[w, g]
            x1 = plane1[w, g]
            for k in range(8):
                rows[g, 8 * w + k] = low[x0 & U64(255)] | high[x1 & U64(255)]
                x0 >>= U64(8)
                x1 >>= U64(8)
        for w in range(full, words):
            x0 = plane0[w, g]
            x1 = plane1[w, g]
            for k in range(chunks - 8 * w):
                rows[g, 8 * w + k] = low[x0 & U64(255)] | high[x1 & U64(255)]
                x0 >>= U64(8)
                x1 >>= U64(8)


@njit(parallel=True, cache=True)
def _run(trajectory: np.ndarray, rows64: np.ndarray, length: int, leaf: np.ndarray, low: np.ndarray,
         high: np.ndarray, chunk: int) -> None:
    steps = trajectory.shape[0] - 1
    grids = trajectory.shape[1]
    words = (length + 63) // 64
    phases = leaf.shape[0]
    last_bit = U64((length - 1) & 63)
    for task in nb.prange((grids + chunk - 1) // chunk):
        first = task * chunk
        n = min(chunk, grids - first)
        cur0 = np.zeros((words, chunk), U64)
        cur1 = np.zeros((words, chunk), U64)
        nxt0 = np.zeros((words, chunk), U64)
        nxt1 = np.zeros((words, chunk), U64)
        for g in range(n):
            row = trajectory[0, first + g]
            for i in range(length):
                v = row[i]
                cur0[i >> 6, g] |= U64(v & 1) << U64(i & 63)
                cur1[i >> 6, g] |= U64(v >> 1) << U64(i & 63)
        for t in range(steps):
            for w in range(words):
                q = w % phases
                wl = w - 1 if w > 0 else words - 1
                wr = w + 1 if w < words - 1 else 0
                lsh = last_bit if w == 0 else U64(63)
                rsh = last_bit if w == words - 1 else U64(63)
                _advance_word(leaf[q, 0], leaf[q, 1], cur0[wl], cur1[wl], cur0[w], cur1[w],
                              cur0[wr], cur1[wr], nxt0[w], nxt1[w], n, lsh, rsh)
            _unpack(nxt0, nxt1, rows64[t + 1, first:first + n], n, low, high)
            cur0, nxt0 = nxt0, cur0
            cur1, nxt1 = nxt1, cur1


def simulate(states: np.ndarray, lut: np.ndarray, steps: int) -> np.ndarray:
    """`states [B, L]` → `[steps+1, B, L]`. Rows are padded to 8 cells for the 8-byte stores; for
    lengths not a multiple of 8 the padding is cut off with one copy."""
    grids, length = states.shape
    padded = -(-length // 8) * 8
    trajectory = np.empty((steps + 1, grids, padded), dtype=np.uint8)
    trajectory[0, :, :length] = states
    trajectory[0, :, length:] = 0
    # Enough tasks to keep every thread busy, each as wide as possible for the vector loop.
    chunk = min(MAX_CHUNK, -(-grids // nb.get_num_threads()))
    low = _spread_table()
    _run(trajectory, trajectory.view(U64), length, leaves(lut), low, low << U64(1), chunk)
    return trajectory if padded == length else np.ascontiguousarray(trajectory[:, :, :length])
