"""The universe on a GPU: one launch advances many grids several steps, halos kept in registers.

Each program owns one tile of one grid: `BLOCK` consecutive cells, the `inner = BLOCK - 2*HALO` it
writes plus `HALO` cells of halo on each side. It loads the tile once (a coalesced read of
consecutive bytes), then runs up to `HALO` steps entirely in registers: a step reads each cell's left
and right neighbours with `tl.gather` (a shift by one lane), looks the next symbol up in the rule
table (64 bytes a class, resident in L1), and stores the tile's own cells to that step's row of the
trajectory. After k steps the outermost k cells of the tile are stale (their neighbours were outside
the tile); with k ≤ HALO the owned cells never are, so tiles need no communication within a launch.

Positions are taken mod L, so a tile wider than the ring simply sees the ring repeated: the unwrapped
neighbour of tile lane e is lane e-1, whatever L is (L = 1, 2 and 3 included).

`universe_steps` is the kernel as Triton compiles it for the GPU (it honours TRITON_INTERPRET=1, read
when this module is imported); `interpreted()` gives the same kernel run by Triton's interpreter, for
CPU tensors on a machine without a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import triton  # type: ignore[import-untyped]  # triton ships no annotations
import triton.language as tl  # type: ignore[import-untyped]


# Triton reads a kernel's parameter annotations (tl.constexpr marks the compile-time ones), so the
# runtime arguments stay unannotated rather than risk one being taken for a type specialisation.
def _universe_steps(src_ptr, out_ptr, lut_ptr, length, period, wrap, n_steps, row_stride,  # type: ignore[no-untyped-def]
                    BLOCK: tl.constexpr, HALO: tl.constexpr):
    """src: the trajectory row to start from, `[B, L]`; out: the same row, whose next `n_steps` rows
    (`row_stride = B*L` bytes apart) this launch fills; lut: `[period, 64]` uint8."""
    # Rings on axis 0 (up to 2**31 - 1 programs), tiles on axis 1 (CUDA caps it at 65535).
    grid = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    lane = tl.arange(0, BLOCK)
    start = tile * (BLOCK - 2 * HALO)
    # `wrap` is a multiple of L that keeps the position non-negative before the modulo.
    cell = (start - HALO + lane + wrap) % length
    own = (lane >= HALO) & (lane < BLOCK - HALO) & (start - HALO + lane < length)
    row = grid * length + cell
    lut_row = (cell % period) * 64
    left_lane = tl.maximum(lane - 1, 0)
    right_lane = tl.minimum(lane + 1, BLOCK - 1)
    x = tl.load(src_ptr + row).to(tl.int32)
    out_row = row  # int64: steps × B × L may pass 2**31
    for _ in range(n_steps):
        left = tl.gather(x, left_lane, 0)
        right = tl.gather(x, right_lane, 0)
        x = tl.load(lut_ptr + lut_row + left * 16 + x * 4 + right).to(tl.int32)
        out_row += row_stride
        tl.store(out_ptr + out_row, x.to(tl.uint8), mask=own)


universe_steps = triton.jit(_universe_steps)


@functools.cache
def interpreted() -> Any:  # a triton JITFunction (untyped)
    """The kernel under Triton's interpreter, whatever TRITON_INTERPRET says (built once)."""
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        return triton.jit(_universe_steps)
