"""The universe simulators side by side: numba (and Triton) against the numpy reference, same run,
same rule, same grids. The ratio numba/numpy is the figure that travels."""

from __future__ import annotations

import time

import numpy as np

from bench.result import BenchResult

GRIDS, LENGTH, STEPS = 256, 1024, 64          # 16.8M cell-updates a run
GPU_GRIDS, GPU_LENGTH, GPU_STEPS = 4096, 4096, 256
INTERPRET_GRIDS, INTERPRET_LENGTH, INTERPRET_STEPS = 2, 2048, 32  # Triton's CPU interpreter is slow
RULE = "kinetic"
ROUNDS = 5
ALL = ("numpy", "numba", "triton")


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


def run(backends: list[str] | None = None) -> BenchResult:
    from universe.device import gpu_available
    from universe.sampling import random_states

    wanted = list(backends or ALL)
    if "auto" in wanted:
        from universe.simulate import resolve_backend

        wanted = [resolve_backend("auto") if b == "auto" else b for b in wanted]
    if "numba" in wanted and "numpy" not in wanted:
        wanted.append("numpy")  # the ratio needs its reference, measured in the same run
    rng = np.random.default_rng(0)
    states = random_states(rng, GRIDS, LENGTH)
    figures: dict[str, float | int] = {"grids": GRIDS, "length": LENGTH, "steps": STEPS}
    notes = {"rule": RULE, "numpy": "reference: one vectorised numpy step at a time",
             "numba": "bit-sliced: 64 cells per uint64 word, multiplexer-tree rule, threads over grids"}
    cpu = [backend for backend in ("numpy", "numba") if backend in wanted]
    for backend, speed in cells_per_second(cpu, states, STEPS, ROUNDS).items():
        figures[f"{backend}_cells_per_s"] = speed
    if "numba" in wanted:
        import numba

        figures["numba_threads"] = numba.get_num_threads()  # numpy's reference runs on one
    if "triton" in wanted:
        if gpu_available():
            big = random_states(rng, GPU_GRIDS, GPU_LENGTH)
            figures["triton_cells_per_s"] = cells_per_second(["triton"], big, GPU_STEPS, ROUNDS)["triton"]
            notes["triton"] = f"GPU, {GPU_GRIDS} grids x {GPU_LENGTH} cells x {GPU_STEPS} steps"
        else:
            small = random_states(rng, INTERPRET_GRIDS, INTERPRET_LENGTH)
            speed = cells_per_second(["triton"], small, INTERPRET_STEPS, 1)["triton"]
            figures["triton_interpret_cells_per_s"] = speed
            notes["triton"] = (f"no GPU: Triton's CPU interpreter on {INTERPRET_GRIDS} grids x "
                               f"{INTERPRET_LENGTH} cells x {INTERPRET_STEPS} steps (a correctness path, "
                               "not a speed one); see kernels/README.md for the GPU estimate")
    ratios = {}
    if "numba_cells_per_s" in figures and "numpy_cells_per_s" in figures:
        ratios["numba_over_numpy"] = figures["numba_cells_per_s"] / figures["numpy_cells_per_s"]
    return BenchResult(bench="universe", figures=figures, ratios=ratios, notes=notes)
