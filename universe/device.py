"""Whether a GPU is there to run the Triton backend on; asked by `simulate` (to resolve "auto") and by
the Triton host code (where to put the tensors), so it sits below both."""

from __future__ import annotations

import functools
import os


@functools.cache
def gpu_available() -> bool:
    """Whether torch sees a GPU. Without NVIDIA or ROCm device nodes the answer is no, and importing
    torch (~1 s) is skipped, which keeps `ahc universe simulate` quick on a CPU machine."""
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
