"""Benchmark names → the module that runs each. A module exposes `run() -> BenchResult`."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from bench.result import BenchResult

BENCHES: dict[str, str] = {
    "universe": "bench.universe",
    "xdb": "bench.xdb",
    "orchestrator": "bench.orchestrator",
    "activations": "bench.activations",
    "serve": "bench.serve",
    "retrieval": "bench.retrieval",
    "agents": "bench.agents",
    "cluster": "bench.cluster",
    "long-session": "bench.long_session",
    "quality": "bench.quality",
}


def runner(name: str) -> Callable[[], BenchResult]:
    if name not in BENCHES:
        raise ValueError(f"unknown benchmark {name!r}; choose from all, {', '.join(BENCHES)}")
    run: Callable[[], BenchResult] = importlib.import_module(BENCHES[name]).run
    return run
