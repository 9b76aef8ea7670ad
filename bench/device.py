"""The device the benchmarks' engines run on, for their notes."""

from __future__ import annotations


def engine_device() -> str:
    """The first GPU's name where vLLM's CUDA build would use one, else "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
