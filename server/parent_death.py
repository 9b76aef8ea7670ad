"""vLLM's engine process dies with the `ahc serve` process that started it.

vLLM's EngineCore does not watch the API process: after a SIGKILL of `ahc serve` (the OOM killer, a
crash) it lives on, holding the model and its KV cache (GPU memory on a workstation), and the next
start fails for want of memory. vLLM runs its general plugins (entry point group
`vllm.general_plugins`) in every process it starts; in a direct child of an `ahc serve` process this
one asks the kernel (prctl PR_SET_PDEATHSIG) to SIGKILL it when that parent dies. The workers of a
multiprocess executor already follow their EngineCore through vLLM's own death pipe; they are not
touched, because the death signal follows the parent *thread*, which vLLM does not promise to keep.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

SERVER_PID = "AHC_SERVER_PID"
PR_SET_PDEATHSIG = 1


def mark_server() -> None:
    """Called by `ahc serve` before it starts the engine: its children find its pid here."""
    os.environ[SERVER_PID] = str(os.getpid())


def register() -> None:
    """The plugin: in a direct child of `ahc serve`, die with it."""
    owner = os.environ.get(SERVER_PID)
    if not owner or not sys.platform.startswith("linux") or os.getppid() != int(owner):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != int(owner):  # the server died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
