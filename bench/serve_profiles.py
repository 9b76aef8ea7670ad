"""The loads `ahc bench serve` can put on the servers. Free of heavy imports: the command line reads
the names for its `--profile` choices."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """A model (bench/models.py), its lens layer, and the load: `clients` concurrent streaming clients,
    each sending `requests` chat requests of `max_tokens` tokens one after another."""

    name: str
    model: str
    lens_layer: int
    clients: int
    requests: int
    max_tokens: int
    rounds: int
    max_num_seqs: int | None  # None: the config's own
    description: str


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("6x512", "bench-6x512", lens_layer=3, clients=8, requests=2, max_tokens=128, rounds=6, max_num_seqs=None,
            description="random Llama 6x512 (ahc tiny-model), float32"),
    # On a GPU the engine makes tokens 50-500x faster than this CPU does on the 6x512 model, and the API
    # process's CPU per token decides throughput. A model this small brings the CPU engine as close to
    # that as it gets.
    Profile("gpu-rate", "bench-2x64", lens_layer=1, clients=32, requests=1, max_tokens=256, rounds=6,
            max_num_seqs=64, description="random Llama 2x64 (ahc tiny-model), float32: the engine as fast as "
                                         "this CPU makes it"),
)}

DEFAULT_PROFILE = "6x512"
SCALING_STREAMS = (1, 8, 32, 64)
SCALING_ROUNDS = 3
