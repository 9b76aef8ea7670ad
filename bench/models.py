"""The random models the benchmarks build with `ahc tiny-model`, cached under .cache/models by name:
a name stands for one set of sizes, whichever benchmark builds it first."""

from __future__ import annotations

import json
from pathlib import Path

MODELS: dict[str, tuple[str, ...]] = {
    # Larger than the tests' tiny model, so the forward is not all overhead.
    "bench-6x512": ("--layers", "6", "--hidden", "512", "--heads", "8", "--kv-heads", "2", "--intermediate", "1024",
                    "--max-position", "8192"),
    # As small as vLLM's CPU attention allows (head_dim 64): the engine's forward costs next to nothing.
    "bench-2x64": ("--layers", "2", "--hidden", "64", "--heads", "1", "--kv-heads", "1", "--intermediate", "128",
                   "--max-position", "4096"),
}


def model_max_len(model_dir: Path) -> int:
    """The longest window a model directory's config allows."""
    return int(json.loads((model_dir / "config.json").read_text())["max_position_embeddings"])
