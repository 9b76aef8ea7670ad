"""`ahc bench agents`: many agent sessions sharing one KV cache too small for all of them, AHC's
session-aware admission against the same server admitting first come, first served.

Each session is an agent loop through the `context` field: its own `session_id`, Identity and Codex
of a few hundred tokens, and a State the server keeps, so a turn sends only its new user message; a
seeded think time separates its turns. The engine's KV cache is cut to a fixed number of blocks
(`--num-gpu-blocks-override`) so that the sessions' contexts at their last turn add up to about
`cache_multiple` times its capacity: while one session thinks, the others' prefills evict its blocks,
and what a scheduler gains is how much of each session's previous turn is still cached when it
returns. The model is the smallest random one vLLM's CPU attention takes, so a prefill costs next to
nothing and a turn held back can only lose time: session-aware admission must then hold nothing and
match first come, first served. `model=bench-6x512` in the load makes a prefill cost real time (as a
long context does on a GPU), where a hit is worth a short wait.

Both servers run the same model, flags and load, up together, measured in alternating rounds; FCFS is
AHC with `orchestrator.session_admission` off. On the emulated engine (`ahc bench agents --engine
emulated`, EMULATED_LOAD) three more sides take the same load: vanilla `vllm serve`, `vllm serve` with
native CPU offloading of AHC's tier size, and the ideal, vanilla vLLM on a cache that holds every
session; there every call sends the session's whole history, as agent clients do. Every round uses new
sessions with new content, so no round reuses another's cache. Reported per server: the hit ratio
(cached / prompt tokens over every turn after each session's first) against the ceiling an ideal cache
reaches on the same turns,
completion tokens per second of the round's wall time, the engine's preemptions, TTFT, the server's
admission wait (its `ahc_session_wait_seconds` histogram), the client's wait from a turn being ready to
its first token, and the 429s the VRAM governor answered (each retried after its Retry-After).

The load is `LOADS` (bench/agents/load.py; bench/load.py): `BENCH_AGENTS_LOAD="smoke"`, or e.g.
`"sessions=4,turns=3"` to change the default's fields (`--engine emulated`'s preset's with it).

The parts: the load (load.py), what each session sends (scripts.py), the cache it is sized to
(cache.py), the servers (servers.py), the client that runs the sessions on one (client.py), and the
figures (figures.py).
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.agents.cache import NULL_BLOCKS, CacheSize, sizing
from bench.agents.client import Side
from bench.agents.figures import AgentRound, combine, governor_actions, ratios_of
from bench.agents.load import AHC_SIDES, SIDES, AgentLoad
from bench.agents.load import LOADS as LOADS  # the registry finds a bench's loads in its module
from bench.agents.servers import FCFS_ENV, start_sides, switch_available
from bench.device import engine_device
from bench.models import MODELS
from bench.result import BenchResult
from bench.rounds import alternating_rounds
from bench.servers import ensure_model, stop_together
from core.config import cache_dir, load_config
from server.emulation.engine_flags import BLOCK_SIZE as EMULATED_BLOCK_SIZE
from server.emulation.engine_flags import gpu_batch_defaults
from server.emulation.profiles import profile


def run(load: AgentLoad) -> BenchResult:
    """Every side under the load, measured in alternating rounds."""
    model_dir = ensure_model(cache_dir() / "models" / load.model, *MODELS[load.model])
    block_size = EMULATED_BLOCK_SIZE if load.emulate else load_config("cpu-tiny").engine.block_size
    if block_size is None:
        raise RuntimeError("agents bench: the cpu-tiny config names no engine.block_size to size the cache in")
    size, estimate = sizing(model_dir, load, block_size)
    switch = switch_available()
    with tempfile.TemporaryDirectory() as tmp:
        servers = start_sides(model_dir, Path(tmp), size, load, FCFS_ENV if switch else {})
        try:
            first = next(iter(servers.values()))
            model = httpx.get(f"{first.base_url}/v1/models", timeout=60).json()["data"][0]["id"]
            sides = [Side(name, server, model, load) for name, server in servers.items()]
            measured = alternating_rounds([side.measure for side in sides], load.rounds, load.warmup)
        finally:
            stop_together(list(servers.values()))
    return result_of(load, size, estimate, dict(zip(servers, measured)), switch)


def result_of(load: AgentLoad, size: CacheSize, estimate: int, sides: dict[str, Sequence[AgentRound]],
              switch: bool) -> BenchResult:
    figures = combine(sides, size.block_size)
    ahc = sides["ahc"]
    last = [turns[-1].prompt_tokens + turns[-1].completion_tokens for r in ahc for turns in r.sessions]
    per_session = statistics.mean(math.ceil(t / size.block_size) for t in last)
    figures.update(sessions=load.sessions, turns=load.turns, max_tokens=load.max_tokens, rounds=load.rounds,
                   kv_blocks=size.blocks, block_size=size.block_size, max_model_len=size.max_model_len,
                   session_tokens_estimate=estimate, session_tokens_last=statistics.mean(last),
                   cache_multiple=load.sessions * per_session / (size.blocks - NULL_BLOCKS),
                   offload_gib=load.offload_gib)
    notes = {"model": f"random Llama {load.model.removeprefix('bench-')} ({load.model}, ahc tiny-model)",
             "device": f"EMULATED {load.emulate} (server/emulation/)" if load.emulate else engine_device(),
             "load": load.describe(),
             "sides": ", ".join(f"{name}: {SIDES[name]}" for name in sides),
             "jct": "job completion time: a session's first call sent to its last reply, tool and think "
                    "times included; fcfs_jct_over_ahc > 1 is AHC finishing jobs sooner; jct_mean_spread_s: "
                    "the largest less the smallest round's mean; gain_captured: (vllm - side) / (vllm - "
                    "ideal) by mean JCT",
             "cache": f"--num-gpu-blocks-override {size.blocks} ({size.block_size}-token blocks), "
                      f"--max-model-len {size.max_model_len}; cache_multiple: the sessions' last-turn contexts "
                      "over the cache's usable blocks, as measured"
                      + (f"; the ideal side: {size.blocks_for_all} blocks" if "ideal" in sides else ""),
             "fcfs": ("AHC with AHC_ORCHESTRATOR__SESSION_ADMISSION=false" if switch else
                      "this build has no orchestrator.session_admission: FCFS is the same server as AHC, "
                      "so both columns measure the same policy"),
             "hit_ratio": "cached / prompt tokens (usage.prompt_tokens_details, both tiers) over every turn "
                          "after each session's first; the ceiling: per turn, the previous request's prompt "
                          "and reply in whole blocks, over the same prompt tokens; device_hit_tokens and "
                          "host_hit_tokens: vllm:prompt_tokens_cached_by_source over every call",
             "ttft": "ttft_p50_ms/ttft_p99_ms: every call's; ttft_p50_s/ttft_p99_s: each session's first "
                     "call's, admission included",
             "wait": "wait_p99_ms: the server's session-admission wait (ahc_session_wait_seconds, bucket deltas "
                     "over the measured rounds) at its p99 over every attempt, turns let straight in counted as 0, "
                     "interpolated within buckets as histogram_quantile does, capped at the client-side p99 that "
                     "contains it; held_turns/held_s: the turns it held and their total seconds; "
                     "ready_to_token_p99_ms: client-side, from a turn's first attempt to its first token "
                     "(admission, VRAM governor queue, 429 back-offs, prefill); ttft includes admission too",
             "counters": "preemptions (vllm:num_preemptions_total), 429s, load_bytes and store_bytes "
                         "(vllm:kv_offload_*_bytes) summed over the measured rounds",
             "rounds_jct_mean_s": "; ".join(f"{name} " + ", ".join(f"{statistics.mean(r.jct_s):.1f}" for r in rounds)
                                            for name, rounds in sides.items()),
             "rounds_tok_per_s": "; ".join(f"{name} " + ", ".join(f"{r.tok_per_s:.1f}" for r in rounds)
                                           for name, rounds in sides.items()),
             "governor": "; ".join(f"{name} {governor_actions(rounds)}" for name, rounds in sides.items()
                                   if name in AHC_SIDES)}
    if load.emulate:
        tokens, seqs = gpu_batch_defaults(profile(load.emulate).gpu)
        notes["scheduler"] = (f"every side: --max-num-batched-tokens {tokens} --max-num-seqs {seqs}, vLLM's "
                              f"defaults for its server on the emulated {profile(load.emulate).gpu.name}")
    return BenchResult("agents", figures, ratios_of(figures), notes)
