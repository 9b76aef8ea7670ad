"""Every benchmark by name: its module, what it measures, and the command-line options it takes.

A bench's module exposes `LOADS` (bench/load.py: its presets, `smoke` among them) and
`run(load, **options) -> BenchResult | None` (None: nothing to report, as `serve --plot` alone). Its
load comes from `BENCH_<NAME>_LOAD` over the preset its options choose; modules are imported only when
their bench runs, so that `ahc --help` stays quick.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.load import Loads
from bench.options import Option, chosen_preset, run_options
from bench.result import BenchResult
from bench.serve_profiles import EMULATED_PROFILE, PROFILES, SCALING_STREAMS

OUT = Path("bench-results")
ENGINE_HELP = ("'emulated' runs the servers on an emulated H100 serving Llama-3.1-8B (vLLM's real scheduler and KV "
               "cache; docs/emulation.md): ")


@dataclass(frozen=True)
class Bench:
    name: str
    module: str
    summary: str
    options: tuple[Option, ...] = ()

    def loads(self) -> Loads[Any]:
        loads: Loads[Any] = importlib.import_module(self.module).LOADS
        return loads

    def load(self, values: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Any:
        """The load the options' values and the environment choose."""
        return self.loads().from_env(chosen_preset(self.options, values), environ)

    def run(self, values: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None) -> BenchResult | None:
        """The bench at the load its options and the environment choose (`values`: options by name)."""
        values = values or {}
        load = self.load(values, environ)
        result: BenchResult | None = importlib.import_module(self.module).run(load, **run_options(self.options,
                                                                                                     values))
        return result


def engine(emulated_preset: str, what: str) -> Option:
    return Option("engine", ENGINE_HELP + what, choices=("real", "emulated"), default="real",
                  presets={"emulated": emulated_preset})


SERVE_OPTIONS = (
    Option("profile", "The load: " + "; ".join(
        f"{p.name}: {p.clients} streaming clients x {p.requests} x {p.max_tokens} tokens, {p.description}"
        for p in PROFILES.values()) + ". Default: 6x512.", choices=tuple(PROFILES),
        presets={name: name for name in PROFILES}),
    Option("rounds", "Measured rounds (default: the profile's).", int, minimum=1),
    Option("base_url", "Load this running server instead of starting AHC and vLLM."),
    Option("model", "With --base-url: the model name (default: the first served)."),
    Option("api_key", "With --base-url: the server's API key."),
    Option("pid", "With --base-url: its API process, for CPU per token.", int),
    Option("api_server_count", "API processes on each side (`--api-server-count` for both servers).", int, 1,
           minimum=1),
    Option("scaling", f"Tokens/s and API CPU per token at {', '.join(map(str, SCALING_STREAMS))} streams (the "
                      "profile's), into OUT/serve-scaling.json.", bool, False),
    Option("plot", "Draw OUT/serve-scaling.png (matplotlib) from the scaling results, this run's or the saved ones.",
           bool, False),
    Option("out", "Where --scaling and --plot write their files.", Path, OUT),
    engine(EMULATED_PROFILE, f"the {EMULATED_PROFILE} profile."),
)

BENCHES: dict[str, Bench] = {b.name: b for b in (
    Bench("universe", "bench.universe", "Cell-updates/s of the simulators' backends against numpy's.",
          (Option("backend", "Backend to measure (repeatable); default all. numpy is always measured as the "
                             "reference when numba is.", choices=("numpy", "numba", "triton"), repeat=True),)),
    Bench("xdb", "bench.xdb", "XDB's writer against a raw DuckDB insert, recall, restart, storage and erasure."),
    Bench("orchestrator", "bench.orchestrator", "An agent session through the orchestrator against the same "
                                                "content sent naively."),
    Bench("activations", "bench.activations", "Decode tokens/s with in-engine concept capture on and off."),
    Bench("serve", "bench.serve", "AHC's server against vLLM's own api_server under the same streaming load.",
          SERVE_OPTIONS),
    Bench("retrieval", "bench.retrieval", "The RAG path: chunking, embedding, sync and search latency."),
    Bench("agents", "bench.agents", "Agent sessions sharing a KV cache too small for all: AHC's session-aware "
                                    "admission against first come, first served.",
          (engine("emulated", "coding agents' sessions, against vanilla vLLM, vLLM with CPU offload and the "
                              "ideal cache too."),)),
    Bench("cluster", "bench.cluster", "Two replicas behind vLLM's router: session affinity against round robin, "
                                      "and a replica killed under load."),
    Bench("long-session", "bench.long_session", "One coding agent's session far past the window, through AHC and "
                                                "two ordinary clients of vLLM."),
    Bench("quality", "bench.quality", "Answers with no Codex, the Codex in the prompt, retrieved, and condensed."),
)}


def bench_named(name: str) -> Bench:
    if name not in BENCHES:
        raise ValueError(f"unknown benchmark {name!r}; choose from all, {', '.join(BENCHES)}")
    return BENCHES[name]
