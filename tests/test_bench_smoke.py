"""Every benchmark in bench/registry.py runs in `make test`: `ahc bench NAME --json` at a small load, its
JSON line checked for the figures and ratios the bench reports. A bench registered without an entry in
tests/bench_smoke.py fails here, so none goes unsmoked. The benches another test already runs end to
end are checked there, against the same entries."""

from __future__ import annotations

import importlib

import pytest
from bench_smoke import SMOKES, run_bench

from bench.registry import BENCHES

# Bench -> (test module, test function) that runs it and checks its result against SMOKES.
ELSEWHERE: dict[str, tuple[str, str]] = {
    "universe": ("test_universe_cli", "test_ahc_bench_universe_json_has_every_backend"),
    "agents": ("test_agents_bench", "test_bench_agents_end_to_end"),
    "cluster": ("test_cluster", "test_a_killed_replica_fails_over_from_the_lake_and_every_chain_verifies"),
    "quality": ("test_quality_bench", "test_the_quality_bench_runs_on_the_real_model_server"),
    "orchestrator": ("test_bench_smoke", "test_the_orchestrator_bench_runs_on_the_real_model"),
}
# The benches that start no vLLM engine (marker `engine` on the others).
ENGINE_FREE = frozenset({"universe", "xdb", "retrieval"})


@pytest.mark.parametrize("name", list(BENCHES))
def test_every_registered_bench_has_a_smoke_run(name: str) -> None:
    assert name in SMOKES, f"bench {name!r} has no entry in tests/bench_smoke.py SMOKES: give it a small load"
    if name in ELSEWHERE:
        module, test = ELSEWHERE[name]
        assert callable(getattr(importlib.import_module(module), test, None)), f"{module}.{test} is gone"


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in ENGINE_FREE else pytest.mark.engine)
                                  for name in BENCHES if name not in ELSEWHERE])
def test_bench_runs_at_a_small_load(name: str) -> None:
    run_bench(name)


@pytest.mark.slow
@pytest.mark.real_model
def test_the_orchestrator_bench_runs_on_the_real_model() -> None:
    # Its smoke run, on the real model: its density session sizes the Codex by the served model's tokenizer
    # and the model condenses it (on the tiny model the same run would start another engine).
    env = SMOKES["orchestrator"].env["BENCH_ORCHESTRATOR_LOAD"] + ",model=smollm2-135m"
    result = run_bench("orchestrator", env={"BENCH_ORCHESTRATOR_LOAD": env})
    assert result["notes"]["model"].startswith("SmolLM2-135M-Instruct")
    figures = result["figures"]
    assert figures["density_codex_tokens_condensed"] < figures["density_codex_tokens_full"]
