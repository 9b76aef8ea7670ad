"""The engine process vLLM starts for `ahc serve`: forked from the server on the CPU, and dying with it.

**Forked on the CPU.** vLLM's CPU platform asks for every process it starts to be spawned, for the OpenMP
thread pools of the workers that run the model. Spawned, a process imports torch and vLLM again (~7 s of
CPU on a small machine) before it loads anything. The server process runs no torch computation before it
starts the engine, so the engine core is forked from it instead (as vLLM itself does on a GPU). The
workers the engine core starts in turn are spawned, as the platform asks, where one computes on several
CPUs: a spawned worker's OpenMP runtime starts with vLLM's thread count and affinity in its environment
and PyTorch's libgomp preloaded ahead of the others the server loaded (scikit-learn's, sentencepiece's).
A worker vLLM binds to a single CPU has no thread pool to set up: it is forked too, and a server start
takes one import of torch and vLLM, not two (a tiny model's start 22 s -> 13 s here).

**Dying with the server.** vLLM's EngineCore does not watch the API process: after a SIGKILL of `ahc
serve` (the OOM killer, a crash) it lives on, holding the model and its KV cache (GPU memory on a
workstation), and the next start fails for want of memory. A direct child of an `ahc serve` process asks
the kernel (prctl PR_SET_PDEATHSIG) to SIGKILL it when that parent dies: a forked one as it is forked, a
spawned one from vLLM's general plugins (entry point group `vllm.general_plugins`), which vLLM runs in
every process it spawns. The workers of a multiprocess executor already follow their EngineCore through
vLLM's own death pipe; they are not touched, because the death signal follows the parent *thread*, which
vLLM does not promise to keep.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig

SERVER_PID = "AHC_SERVER_PID"
START_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"
SPAWN_AFTER_FORK = "AHC_ENGINE_SPAWNS"  # set while the engine core is forked to spawn its own children
PR_SET_PDEATHSIG = 1


def mark_server() -> None:
    """Called by `ahc serve` before it starts the engine: its children find its pid here, and a child
    forked from it follows it."""
    os.environ[SERVER_PID] = str(os.getpid())
    os.register_at_fork(after_in_child=after_fork_in_child)


def workers_on_one_cpu(vllm_config: VllmConfig) -> bool:
    """Whether vLLM binds each worker it starts for `vllm_config` to a single CPU (its executor's binding)."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    cpu_lists = OMPProcessManager(vllm_config).cpu_lists
    return bool(cpu_lists) and all(len(cpus) == 1 for cpus in cpu_lists)


@contextmanager
def forked_engine(on_cpu: bool, fork_workers: bool = False) -> Iterator[None]:
    """Around the creation of vLLM's engine client: on the CPU the engine core is forked, not spawned, and
    its workers too with `fork_workers` (each on one CPU: `workers_on_one_cpu`)."""
    if not on_cpu:
        yield
        return
    before = os.environ.get(START_METHOD)
    os.environ[START_METHOD] = "fork"
    if not fork_workers:
        os.environ[SPAWN_AFTER_FORK] = "1"
    try:
        yield
    finally:
        os.environ.pop(SPAWN_AFTER_FORK, None)
        if before is None:
            os.environ.pop(START_METHOD, None)
        else:
            os.environ[START_METHOD] = before


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


def after_fork_in_child() -> None:
    """In a child forked from the server: it follows the server, and what it starts is spawned again
    unless its workers are forked too."""
    if os.environ.pop(SPAWN_AFTER_FORK, None):
        os.environ[START_METHOD] = "spawn"
    register()
