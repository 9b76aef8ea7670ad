"""The GPU path's host side without a GPU: pinned buffers lent as the caller's array and taken back only
once it is gone (torch CPU tensors stand in for page-locked ones), and the tile width chosen from what
was measured on each GPU."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from universe.pinned import MAX_FREE, PinnedBuffers
from universe.triton_backend import DEFAULT_BLOCK, _block_for, block_for_gpu, to_host


def fake_pinned() -> PinnedBuffers:
    return PinnedBuffers(lambda n: torch.empty(n, dtype=torch.uint8))


def test_a_buffer_is_reused_once_the_array_lent_from_it_is_gone() -> None:
    buffers = fake_pinned()
    trajectory = torch.arange(60, dtype=torch.uint8).view(3, 4, 5)
    first = to_host(trajectory, buffers)
    assert first.shape == (3, 4, 5) and np.array_equal(first, trajectory.numpy())
    second = to_host(trajectory + 1, buffers)  # `first` is still held: a buffer of its own
    assert buffers.allocations == 2 and np.array_equal(first, trajectory.numpy())
    kept_row = second[1]  # a view keeps its array, and so the buffer, alive
    del first, second
    gc.collect()
    third = to_host(trajectory + 2, buffers)
    assert buffers.allocations == 2 and np.array_equal(kept_row, (trajectory + 1).numpy()[1])
    del third
    gc.collect()
    smaller = to_host(trajectory[:1] + 3, buffers)  # a smaller call fits in a freed, larger buffer
    assert buffers.allocations == 2 and np.array_equal(smaller, (trajectory[:1] + 3).numpy())


def test_free_buffers_are_bounded() -> None:
    buffers = fake_pinned()
    held = [to_host(torch.zeros(n + 1, dtype=torch.uint8), buffers) for n in range(MAX_FREE + 3)]
    del held
    gc.collect()
    buffers.take(1)
    assert len(buffers._free) == MAX_FREE - 1  # the smallest were dropped, the one taken is out


@pytest.mark.parametrize("name, block", [("NVIDIA H100 80GB HBM3", 512), ("NVIDIA H100 PCIe", 512),
                                         ("NVIDIA A100-SXM4-80GB", DEFAULT_BLOCK), ("", DEFAULT_BLOCK)])
def test_the_tile_width_is_the_one_measured_fastest_on_the_gpu(name: str, block: int) -> None:
    assert block_for_gpu(name) == block


def test_a_short_ring_gets_a_tile_that_fits_it() -> None:
    assert _block_for(100, 32, 512) == 256  # 100 cells + 2 halos of 32 in one tile
    assert _block_for(100_000, 32, 512) == 512
    assert _block_for(100_000, 32, None) == 1 << 17  # the interpreter: one tile a ring
