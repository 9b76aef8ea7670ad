"""Host side of the Triton kernel (kernels/universe_step.py): tiles, launches, tensors.

On a GPU the trajectory lives on the device and is copied back once. Without one, the same kernel
runs on CPU tensors in Triton's interpreter (slow: ~1e6 cell-updates/s, for tests on small grids).
"""

from __future__ import annotations

import numpy as np

from universe.device import gpu_available

HALO = 32  # steps per launch; also the halo width each side of a tile
BLOCK = 1024  # cells per tile on a GPU: 8 bytes per thread at 4 warps


def _block_for(length: int, halo: int, on_gpu: bool) -> int:
    # A tile at least as wide as the ring (+ halos) needs one program per grid; the interpreter pays
    # per program, not per lane, so on the CPU tiles grow to fit the ring.
    need = 1 << (length + 2 * halo - 1).bit_length()
    return max(64, min(BLOCK, need)) if on_gpu else max(64, need)


def simulate(states: np.ndarray, lut: np.ndarray, steps: int) -> np.ndarray:
    import torch

    from kernels import universe_step

    on_gpu = gpu_available()
    device = "cuda" if on_gpu else "cpu"
    kernel = universe_step.universe_steps if on_gpu else universe_step.interpreted()
    grids, length = states.shape
    halo = max(1, min(HALO, steps))
    block = _block_for(length, halo, on_gpu)
    tiles = -(-length // (block - 2 * halo))
    trajectory = torch.empty((steps + 1, grids, length), dtype=torch.uint8, device=device)
    trajectory[0] = torch.from_numpy(states).to(device)
    table = torch.from_numpy(np.array(lut, dtype=np.uint8)).to(device)  # a writable copy
    wrap = length * -(-halo // length)
    for t0 in range(0, steps, halo):
        n_steps = min(halo, steps - t0)
        kernel[(grids, tiles)](trajectory[t0], trajectory[t0], table, length, lut.shape[0], wrap,
                               n_steps, grids * length, BLOCK=block, HALO=halo)
    return trajectory.cpu().numpy()
