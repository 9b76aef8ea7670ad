"""The loads `ahc bench serve` can put on the servers, its profiles. Free of heavy imports: the command
line reads the names for its `--profile` choices.

`--profile` or `BENCH_SERVE_LOAD` (bench/load.py) names the profile; `BENCH_SERVE_LOAD` may change its
fields too, e.g. `"clients=2,requests=1,max_tokens=16,rounds=1"` (`--rounds` still wins over `rounds`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bench.load import SMOKE, Loads


@dataclass(frozen=True)
class Profile:
    """A model (bench/models.py's SERVED, with its lens), and the load: `clients` concurrent streaming clients,
    each sending `requests` chat requests of `max_tokens` tokens one after another."""

    name: str
    model: str
    clients: int
    requests: int
    max_tokens: int
    rounds: int
    max_num_seqs: int | None  # None: the config's own
    description: str
    emulate: str | None = None  # both servers on this emulated engine (server/emulation/), its model's tokenizer
    max_model_len: int = 2048
    scaling_streams: tuple[int, ...] = (1, 8, 32, 64)


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("6x512", "bench-6x512", clients=8, requests=2, max_tokens=128, rounds=6, max_num_seqs=None,
            description="random Llama 6x512 (ahc tiny-model), float32"),
    # On a GPU the engine makes tokens 50-500x faster than this CPU does on the 6x512 model, and the API
    # process's CPU per token decides throughput. A model this small brings the CPU engine as close to
    # that as it gets.
    Profile("gpu-rate", "bench-2x64", clients=32, requests=1, max_tokens=256, rounds=6,
            max_num_seqs=64, description="random Llama 2x64 (ahc tiny-model), float32: the engine as fast as "
                                         "this CPU makes it"),
    # GPU rates decided, not guessed: vLLM's scheduler and KV cache manager on an emulated H100 running
    # Llama-3.1-8B (docs/emulation.md), so the API process's CPU per token meets a GPU's token rate.
    Profile("h100-llama-8b", "bench-2x64", clients=64, requests=2, max_tokens=256, rounds=3, max_num_seqs=256,
            description="EMULATED: an H100 SXM running Llama-3.1-8B bf16 (roofline model, vLLM's real scheduler "
                        "and KV cache; tokens drawn), with bench-2x64's tokenizer",
            emulate="h100-llama-8b", max_model_len=4096, scaling_streams=(64, 128, 256)),
)}

DEFAULT_PROFILE = "6x512"
# The tests' load: the default profile's model, two short streams, one round.
SMOKE_PROFILE = dataclasses.replace(PROFILES[DEFAULT_PROFILE], name=SMOKE, clients=2, requests=1, max_tokens=16,
                                    rounds=1)
LOADS = Loads("serve", {**PROFILES, SMOKE: SMOKE_PROFILE}, default=DEFAULT_PROFILE)
EMULATED_PROFILE = "h100-llama-8b"  # `ahc bench serve --engine emulated`
SCALING_STREAMS = (1, 8, 32, 64)
SCALING_ROUNDS = 3
