"""The models the benches serve: each named model knows its config and a lens whose examples exist,
and a load naming a model the benches do not know fails before any server starts."""

from __future__ import annotations

from importlib import resources

import pytest

from bench import activations, orchestrator
from bench.models import MODELS, REAL, SERVED, served_model
from core.config import load_config


@pytest.mark.parametrize("name", list(SERVED))
def test_every_served_model_has_a_config_and_lens_examples(name: str) -> None:
    served = SERVED[name]
    assert load_config(served.config).engine.block_size > 0
    assert resources.files("lens").joinpath(f"examples/{served.lens_examples}/examples.json").is_file()
    assert served.path.name == name
    assert name in MODELS or name == REAL  # built by `ahc tiny-model`, or pulled


@pytest.mark.parametrize("bench", [activations, orchestrator])
def test_a_load_names_a_served_model_or_fails_naming_the_choices(bench) -> None:
    assert bench.LOADS.parse(f"model={REAL}").model == REAL
    with pytest.raises(ValueError, match=r"unknown model 'gpt-9'; choose from bench-6x512, bench-2x64, smollm2"):
        bench.LOADS.parse("model=gpt-9")
    assert served_model("bench-6x512").config == "cpu-tiny"
