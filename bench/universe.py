"""The universe simulators side by side: numba (and Triton) against the numpy reference, same run,
same rule, same grids. The ratio numba/numpy is the figure that travels.

The CPU load is `LOADS` (bench/load.py: `BENCH_UNIVERSE_LOAD="smoke"` or e.g. `"grids=16,steps=8,rounds=1"`),
fields: `grids` x `length` cells run `steps` steps, best of `rounds`, for numpy and numba; `interpret_*`
the same for Triton's CPU interpreter where there is no GPU (a GPU run keeps its own size).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from bench.load import DEFAULT, SMOKE, Loads
from bench.result import BenchResult

GPU_GRIDS, GPU_LENGTH, GPU_STEPS = 4096, 4096, 256
RULE = "kinetic"
ALL = ("numpy", "numba", "triton")


@dataclass(frozen=True)
class UniverseLoad:
    """The grids each CPU backend runs (16.8M cell-updates a run by default), and Triton's interpreter's."""

    grids: int = 256
    length: int = 1024
    steps: int = 64
    rounds: int = 5
    # Triton's CPU interpreter is slow: a correctness path, sized apart.
    interpret_grids: int = 2
    interpret_length: int = 2048
    interpret_steps: int = 32


LOADS = Loads("universe", {DEFAULT: UniverseLoad(), SMOKE: UniverseLoad(grids=16, length=256, steps=8, rounds=1,
                                                                    interpret_length=256, interpret_steps=4)})


def cells_per_second(backends: list[str], states: np.ndarray, steps: int, rounds: int) -> dict[str, float]:
    """Best cell-updates/s of each backend over `rounds`, after one warm-up each (JIT, caches).

    The backends take turns within each round, so a burst of load from elsewhere hits them alike
    and the ratio stays fair."""
    from universe import load_rule, simulate

    rule = load_rule(RULE)
    best = dict.fromkeys(backends, float("inf"))
    for backend in backends:
        simulate(states, rule, steps, backend)
    for _ in range(rounds):
        for backend in backends:
            start = time.perf_counter()
            simulate(states, rule, steps, backend)
            best[backend] = min(best[backend], time.perf_counter() - start)
    return {backend: states.size * steps / seconds for backend, seconds in best.items()}


def kernel_cells_per_second(states: np.ndarray, steps: int, rounds: int) -> float:
    """The Triton kernel alone on the GPU: best cell-updates/s with the trajectory left on the device
    (what `simulate` adds is the copy back to the host)."""
    import torch

    from universe import load_rule
    from universe.triton_backend import run_on_device

    lut = load_rule(RULE).lut
    run_on_device(states, lut, steps)  # compile
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run_on_device(states, lut, steps)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return states.size * steps / best


def run(load: UniverseLoad, backend: list[str] | None = None) -> BenchResult:
    """`backend`: the backends to measure (default all; numpy too whenever numba is)."""
    from universe.device import gpu_available
    from universe.sampling import random_states

    wanted = list(backend or ALL)
    if "auto" in wanted:
        from universe.simulate import resolve_backend

        wanted = [resolve_backend("auto") if b == "auto" else b for b in wanted]
    if "numba" in wanted and "numpy" not in wanted:
        wanted.append("numpy")  # the ratio needs its reference, measured in the same run
    rng = np.random.default_rng(0)
    states = random_states(rng, load.grids, load.length)
    figures: dict[str, float | int] = {"grids": load.grids, "length": load.length, "steps": load.steps}
    notes = {"rule": RULE, "numpy": "reference: one vectorised numpy step at a time",
             "numba": "bit-sliced: 64 cells per uint64 word, multiplexer-tree rule, threads over grids"}
    cpu = [backend for backend in ("numpy", "numba") if backend in wanted]
    for backend, speed in cells_per_second(cpu, states, load.steps, load.rounds).items():
        figures[f"{backend}_cells_per_s"] = speed
    if "numba" in wanted:
        import numba

        figures["numba_threads"] = numba.get_num_threads()  # numpy's reference runs on one
    if "triton" in wanted:
        if gpu_available():
            big = random_states(rng, GPU_GRIDS, GPU_LENGTH)
            figures["triton_cells_per_s"] = cells_per_second(["triton"], big, GPU_STEPS, load.rounds)["triton"]
            figures["triton_kernel_cells_per_s"] = kernel_cells_per_second(big, GPU_STEPS, load.rounds)
            notes["triton"] = (f"GPU, {GPU_GRIDS} grids x {GPU_LENGTH} cells x {GPU_STEPS} steps: end to end "
                               "(simulate, the trajectory back in pinned host memory) and the kernel alone "
                               "(triton_kernel_cells_per_s, the trajectory left on the device)")
        else:
            small = random_states(rng, load.interpret_grids, load.interpret_length)
            speed = cells_per_second(["triton"], small, load.interpret_steps, 1)["triton"]
            figures["triton_interpret_cells_per_s"] = speed
            notes["triton"] = (f"no GPU: Triton's CPU interpreter on {load.interpret_grids} grids x "
                               f"{load.interpret_length} cells x {load.interpret_steps} steps (a correctness path, "
                               "not a speed one); see kernels/README.md for the figures measured on an H100")
    ratios = {}
    if "numba_cells_per_s" in figures and "numpy_cells_per_s" in figures:
        ratios["numba_over_numpy"] = figures["numba_cells_per_s"] / figures["numpy_cells_per_s"]
    return BenchResult(bench="universe", figures=figures, ratios=ratios, notes=notes)
