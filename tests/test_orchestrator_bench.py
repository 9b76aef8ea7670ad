"""`ahc bench orchestrator`'s assembly phase at its full size, without an engine: the ~100k-token session
must still be one the orchestrator accepts for its window (the smoke run times only a small one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.orchestrator import (
    ASSEMBLY_MIN_SHARE,
    ASSEMBLY_WINDOW,
    LOADS,
    OrchestratorLoad,
    assembly_p99_ms,
    density_threshold,
)


def test_the_full_assembly_context_fits_the_window_and_is_as_large_as_named(tiny_model_dir: Path) -> None:
    load = OrchestratorLoad(assembly_rounds=3)
    p99_ms, tokens = assembly_p99_ms(tiny_model_dir, load)
    assert ASSEMBLY_MIN_SHARE * load.assembly_tokens <= tokens < ASSEMBLY_WINDOW
    assert p99_ms > 0


def test_load_from_env_overrides_named_fields_and_refuses_a_load_without_warm_turns() -> None:
    assert LOADS.parse(None) == OrchestratorLoad()
    load = LOADS.parse("turns=3,assembly_tokens=8000")
    assert (load.turns, load.assembly_tokens, load.density_turns) == (3, 8000, OrchestratorLoad().density_turns)
    with pytest.raises(ValueError, match="turns must be at least 2"):
        LOADS.parse("turns=1")
    with pytest.raises(ValueError, match="unknown field 'turn'"):
        LOADS.parse("turn=3")
    with pytest.raises(ValueError, match="density_codex_tokens must be 600 to 5000"):
        LOADS.parse("density_codex_tokens=8000")


def test_the_density_threshold_admits_the_rendition_and_not_the_whole_codex() -> None:
    """The density session's CAG threshold, a share of the 8k window: under the whole Codex, over its
    rendition (at most 0.3 of it) and the ~180-token Identity, at either end of the range."""
    for codex_tokens in (600, 1200, 3000, 5000):
        room = density_threshold(codex_tokens) * 8192
        assert 0.3 * codex_tokens + 180 < room < codex_tokens, codex_tokens
