"""Host side of the Triton kernel (kernels/universe_step.py): tiles, launches, tensors.

On a GPU the trajectory is made on the device (`run_on_device`, for callers that keep it there) and,
for `simulate`, copied back once into pinned host memory that is reused from call to call
(universe/pinned.py): a copy into fresh pageable memory ran at 1.2 GB/s on an H100 host, into pinned
memory at 41.6 GB/s. Without a GPU, the same kernel runs on CPU tensors in Triton's interpreter (slow:
~1e6 cell-updates/s, for tests on small grids) and the trajectory is returned without a copy.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from universe.device import gpu_available
from universe.pinned import PinnedBuffers

HALO = 32  # steps per launch; also the halo width each side of a tile
# Cells per tile, by GPU, as measured (kernel only, 1024 rings × 65,536 cells × 256 steps): on an H100
# 80GB HBM3 512 ran at 8.7e11 cell-updates/s, 1024 at 6.5e11, 2048 at 3.9e11. A GPU not measured gets
# DEFAULT_BLOCK (8 bytes a thread at 4 warps).
MEASURED_BLOCK = {"H100": 512}
DEFAULT_BLOCK = 1024


def block_for_gpu(name: str) -> int:
    """The tile width measured fastest on the GPU named `name` (torch's device name), else DEFAULT_BLOCK."""
    return next((block for model, block in MEASURED_BLOCK.items() if model in name), DEFAULT_BLOCK)


def _block_for(length: int, halo: int, gpu_block: int | None) -> int:
    # A tile at least as wide as the ring (+ halos) needs one program per grid; the interpreter pays
    # per program, not per lane, so on the CPU (`gpu_block` None) tiles grow to fit the ring.
    need = 1 << (length + 2 * halo - 1).bit_length()
    return max(64, min(gpu_block, need)) if gpu_block is not None else max(64, need)


@functools.cache
def _gpu_block() -> int:
    import torch

    return block_for_gpu(torch.cuda.get_device_name(0))


@functools.cache
def _host_buffers() -> PinnedBuffers:
    return PinnedBuffers()


def run_on_device(states: np.ndarray, lut: np.ndarray, steps: int, block: int | None = None) -> Any:
    """The trajectory `[steps+1, B, L]` as a torch tensor on the GPU (on the CPU without one). `block`:
    the tile width (default: the GPU's measured one)."""
    import torch

    from kernels import universe_step

    on_gpu = gpu_available()
    device = "cuda" if on_gpu else "cpu"
    kernel = universe_step.universe_steps if on_gpu else universe_step.interpreted()
    grids, length = states.shape
    halo = max(1, min(HALO, steps))
    tile = _block_for(length, halo, (block or _gpu_block()) if on_gpu else None)
    tiles = -(-length // (tile - 2 * halo))
    trajectory = torch.empty((steps + 1, grids, length), dtype=torch.uint8, device=device)
    trajectory[0] = torch.from_numpy(states).to(device)
    table = torch.from_numpy(np.array(lut, dtype=np.uint8)).to(device)  # a writable copy
    wrap = length * -(-halo // length)
    for t0 in range(0, steps, halo):
        n_steps = min(halo, steps - t0)
        kernel[(grids, tiles)](trajectory[t0], trajectory[t0], table, length, lut.shape[0], wrap,
                               n_steps, grids * length, BLOCK=tile, HALO=halo)
    return trajectory


def to_host(trajectory: Any, buffers: PinnedBuffers) -> np.ndarray:
    """A device tensor as a numpy array backed by one of `buffers` (lent until the array is gone)."""
    import torch

    size = trajectory.numel()
    buffer = buffers.take(size)
    host = buffer[:size].view(trajectory.shape)
    host.copy_(trajectory, non_blocking=True)
    if trajectory.is_cuda:
        torch.cuda.current_stream(trajectory.device).synchronize()
    array: np.ndarray = host.numpy()
    buffers.lend(buffer, array)
    return array


def simulate(states: np.ndarray, lut: np.ndarray, steps: int) -> np.ndarray:
    trajectory = run_on_device(states, lut, steps)
    if not trajectory.is_cuda:
        return np.asarray(trajectory.numpy())
    return to_host(trajectory, _host_buffers())
