"""The models the benchmarks serve, cached under .cache/models by name.

Random ones are built with `ahc tiny-model` (a name stands for one set of sizes, whichever benchmark
builds it first); the real one is `ahc model pull`'s SmolLM2-135M-Instruct, served with its own bundled
config and lens, for the figures a model's own text changes."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from bench.servers import build_once, ensure_model
from core.config import cache_dir
from server.cluster.server_process import AHC, child_env

MODELS: dict[str, tuple[str, ...]] = {
    # Larger than the tests' tiny model, so the forward is not all overhead.
    "bench-6x512": ("--layers", "6", "--hidden", "512", "--heads", "8", "--kv-heads", "2", "--intermediate", "1024",
                    "--max-position", "8192"),
    # As small as vLLM's CPU attention allows (head_dim 64): the engine's forward costs next to nothing.
    "bench-2x64": ("--layers", "2", "--hidden", "64", "--heads", "1", "--kv-heads", "1", "--intermediate", "128",
                   "--max-position", "4096"),
}
REAL = "smollm2-135m"


@dataclass(frozen=True)
class ServedModel:
    """A model a bench serves: the bundled config it is served with, and the examples, layer and
    method of the lens pack a capture measurement uses."""

    name: str
    config: str
    lens_examples: str  # a directory under lens/examples
    lens_layer: int
    lens_method: str
    description: str

    @property
    def path(self) -> Path:
        return cache_dir() / "models" / self.name

    def ensure(self) -> Path:
        """The model's directory, built or pulled once."""
        if self.name in MODELS:
            return ensure_model(self.path, *MODELS[self.name])
        run_ahc("model", "pull", self.name, "--out", str(self.path))
        return self.path

    def ensure_lens(self) -> Path:
        """The lens pack of the model's concepts at its layer, trained once (for the real model it is the
        pack `make setup` trains, in the same place)."""
        out = cache_dir() / "lenses" / self.name
        if (out / "lens.json").exists():
            return out
        examples = resources.files("lens").joinpath(f"examples/{self.lens_examples}/examples.json")
        return build_once(out, lambda tmp: run_ahc(
            "lens", "train", "--model", str(self.ensure()), "--examples", str(examples),
            "--layer", str(self.lens_layer), "--method", self.lens_method, "--out", str(tmp)))


SERVED: dict[str, ServedModel] = {m.name: m for m in (
    ServedModel("bench-6x512", "cpu-tiny", "tiny-demo", 3, "means", "random Llama 6x512 (ahc tiny-model), float32"),
    ServedModel("bench-2x64", "cpu-tiny", "tiny-demo", 1, "means", "random Llama 2x64 (ahc tiny-model), float32"),
    ServedModel(REAL, "cpu-small", REAL, 15, "logistic", "SmolLM2-135M-Instruct (ahc model pull), float32"),
)}


def served_model(name: str) -> ServedModel:
    """The served model `name`; an unknown name is a ValueError naming the choices."""
    if name not in SERVED:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(SERVED)}")
    return SERVED[name]


def run_ahc(*args: str) -> None:
    """An `ahc` command the bench needs first; its failure is a RuntimeError with the command's last line."""
    done = subprocess.run([AHC, *args], capture_output=True, text=True, env=child_env())
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise RuntimeError(f"ahc {' '.join(args[:2])}: {last}")


def model_max_len(model_dir: Path) -> int:
    """The longest window a model directory's config allows."""
    return int(json.loads((model_dir / "config.json").read_text())["max_position_embeddings"])
