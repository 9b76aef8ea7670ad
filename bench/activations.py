"""`ahc bench activations`: decode tokens/s with in-engine concept capture on vs off, in one run.

Two servers, same model, same load: by default the random 6x512 Llama the orchestrator bench uses (the
forward is not all overhead as with the tiny one); `model=smollm2-135m` serves the real model with its
own lens pack. `batch` concurrent streaming greedy completions of `max_tokens`
tokens each (`ignore_eos`), short prompts so prefill is negligible. Decode tokens/s is counted in the
window where every stream is decoding (the last first-token to the first last-token).

Both servers are up together and measured in alternating rounds (plain, capture, capture, plain, ...):
this machine's background load drifts by more than the effect measured, and alternating puts the
drift on both sides alike (the idle server sits on the other side of every round too). A warm-up
round each, then `rounds` measured rounds each; the figures are the median rounds, the ratio the
median of each round pair's ratio.

The load is `LOADS` (bench/load.py): `BENCH_ACTIVATIONS_LOAD="smoke"` or e.g. `"batch=2,max_tokens=16,rounds=1"`:
`batch` concurrent streams of `max_tokens` tokens, `rounds` measured rounds a server, `model` one of
bench/models.py's SERVED.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import openai

from bench.device import engine_device
from bench.load import DEFAULT, SMOKE, Loads
from bench.models import ServedModel, served_model
from bench.result import BenchResult
from bench.rounds import alternating_rounds
from bench.servers import start_server, start_together, stop_together


@dataclass(frozen=True)
class ActivationsLoad:
    """Concurrent streams, the tokens each decodes, and the measured rounds on each server."""

    batch: int = 8
    max_tokens: int = 192
    rounds: int = 16
    model: str = "bench-6x512"
    # A warm-up round on each server first (off in the smoke run, whose figures only have to exist).
    warmup: bool = True

    def __post_init__(self) -> None:
        served_model(self.model)  # an unknown model fails here, before any server starts


LOADS = Loads("activations", {DEFAULT: ActivationsLoad(), SMOKE: ActivationsLoad(batch=2, max_tokens=16, rounds=1,
                                                                                      warmup=False)})


def stream_times(client: openai.OpenAI, model: str, seed: int, max_tokens: int) -> list[float]:
    """Arrival time of every token of one streaming completion."""
    times: list[float] = []
    for chunk in client.completions.create(model=model, prompt=f"Cell {seed}: particles move and collide",
                                           max_tokens=max_tokens, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].text is not None:
            times.append(time.perf_counter())
    return times


def decode_round(client: openai.OpenAI, model: str, load: ActivationsLoad) -> float:
    with ThreadPoolExecutor(load.batch) as pool:
        streams = list(pool.map(lambda i: stream_times(client, model, i, load.max_tokens), range(load.batch)))
    start = max(s[0] for s in streams)
    end = min(s[-1] for s in streams)
    tokens = sum(1 for s in streams for t in s if start < t <= end)
    return tokens / (end - start)


def has_activations(base_url: str) -> bool:
    rows = httpx.get(f"{base_url}/v1/xdb/recall", params={"event_types": "output", "limit": 1}, timeout=60).json()
    return bool(rows["data"] and rows["data"][0]["concept_activations"])


def measure(served: ServedModel, load: ActivationsLoad) -> tuple[list[float], list[float], bool]:
    """Rounds of plain and capture decode tokens/s, and whether capture (only) recorded activations."""
    model_dir, pack = served.ensure(), served.ensure_lens()
    with tempfile.TemporaryDirectory() as tmp:
        servers = start_together([partial(start_server, Path(tmp) / name, model=model_dir, config=served.config,
                                          lens=lens, extra=["--max-num-seqs", str(load.batch)])
                                  for name, lens in (("plain", "off"), ("capture", str(pack)))])
        try:
            clients = [s.client(timeout=600) for s in servers]
            model = clients[0].models.list().data[0].id
            rounds = alternating_rounds([lambda c=c: decode_round(c, model, load) for c in clients], load.rounds,
                                        load.warmup)
            right = not has_activations(servers[0].base_url) and has_activations(servers[1].base_url)
        finally:
            stop_together(servers)
    return rounds[0], rounds[1], right


def run(load: ActivationsLoad) -> BenchResult:
    served = served_model(load.model)
    plain_rounds, capture_rounds, right = measure(served, load)
    if not right:
        raise RuntimeError("activations bench: the capture server recorded no activations, or the plain one did")
    plain, capture = statistics.median(plain_rounds), statistics.median(capture_rounds)
    # Each capture round against the plain round measured next to it: this machine's drift (the busy-
    # polling engine core and the worker bound to one core share 2 cores) moves whole stretches of
    # rounds by more than capture costs, and a ratio of the two medians keeps some of it.
    paired = statistics.median(c / p for c, p in zip(capture_rounds, plain_rounds))
    figures = {"decode_tok_per_s_capture": capture, "decode_tok_per_s_plain": plain,
               "batch": load.batch, "max_tokens": load.max_tokens, "rounds": load.rounds}
    return BenchResult("activations", figures, {"capture_over_plain": paired},
                       {"model": served.description, "device": engine_device(),
                        "lens": f"{served.lens_examples} concepts at layer {served.lens_layer} "
                                f"({served.lens_method}), k=10",
                        "median_capture_over_median_plain": f"{capture / plain:.3f}",
                        "rounds_plain": ", ".join(f"{r:.1f}" for r in plain_rounds),
                        "rounds_capture": ", ".join(f"{r:.1f}" for r in capture_rounds)})
