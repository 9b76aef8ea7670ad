"""Benchmark names → the module that runs each. A module exposes `run() -> BenchResult`."""

from __future__ import annotations

import importlib
from typing import Callable

from bench.result import BenchResult

BENCHES: dict[str, str] = {
    "universe": "bench.universe",
    "xdb": "bench.xdb",
    "orchestrator": "bench.orchestrator",
    "activations": "bench.activations",
    "serve": "bench.serve",
    "retrieval": "bench.retrieval",
}


def available() -> list[str]:
    """The benchmarks whose module exists in this checkout."""
    return [name for name, module in BENCHES.items() if importlib.util.find_spec(module) is not None]


def runner(name: str) -> Callable[[], BenchResult]:
    if name not in BENCHES:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHES)}")
    if name not in available():
        raise ValueError(f"benchmark {name!r} is not built yet in this checkout")
    return importlib.import_module(BENCHES[name]).run
