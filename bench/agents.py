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

The load is `AgentLoad`'s defaults; `BENCH_AGENTS_LOAD="sessions=4,turns=3"` overrides fields (the
bench command takes no per-bench options).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np

from ahc.core.config import OrchestratorConfig, cache_dir, load_config
from bench.device import engine_device
from bench.load_spec import overridden
from bench.models import MODELS, model_max_len
from bench.orchestrator import WORDS
from bench.result import BenchResult
from bench.rounds import alternating_rounds
from bench.serve import start_vllm
from bench.servers import ensure_model, start_server, start_together
from bench.stream_load import percentile
from server.cluster.server_process import ServerProcess
from server.emulation.engine_flags import BLOCK_SIZE as EMULATED_BLOCK_SIZE
from server.emulation.engine_flags import gpu_batch_defaults
from server.emulation.profiles import profile

MODEL = "bench-2x64"  # prefill next to free: what a wait may cost is all latency
LOAD_ENV = "BENCH_AGENTS_LOAD"
SWITCH = "session_admission"
FCFS_ENV = {f"AHC_ORCHESTRATOR__{SWITCH.upper()}": "false"}
NULL_BLOCKS = 1  # vLLM keeps one block of the pool back for itself
SLACK_BLOCKS = 2  # the session-size estimate is from the tokenizer, not the rendered prompt
MESSAGE_OVERHEAD_TOKENS = 8  # role markers and separators the chat template adds around a message
MAX_RETRIES = 50
WAIT_HISTOGRAM = "ahc_session_wait_seconds"
WAIT_BUCKET = "session_wait_le:"
REQUEST_TIMEOUT_S = 600


@dataclass(frozen=True)
class AgentLoad:
    """The sessions, their turns and think time, and how far their contexts overcommit the cache."""

    sessions: int = 16
    turns: int = 6
    think_min_s: float = 0.5
    think_max_s: float = 1.0
    max_tokens: int = 24
    cache_multiple: float = 3.0
    rounds: int = 3
    identity_words: int = 120
    codex_docs: int = 2
    codex_words: int = 80
    question_words: int = 20
    seed: int = 0
    # One of bench/models.py's: "bench-6x512" makes a prefill cost real time, as a long context on a GPU.
    model: str = MODEL
    # A coding agent's shape: each user turn is `calls` model calls, each after the first sending a tool's
    # result of `tool_words` words after `tool_min_s`-`tool_max_s` of tool time.
    calls: int = 1
    tool_words: int = 0
    tool_min_s: float = 0.0
    tool_max_s: float = 0.0
    # An emulation profile (server/emulation/): every server on that emulated GPU, `model` only its tokenizer.
    emulate: str = ""
    # Words every session's prompt opens with, as real agents share their system prompt and tool
    # schemas (each round its own, so no round reuses another's cache).
    shared_words: int = 0
    # Tool times: 0, uniform in [tool_min_s, tool_max_s]; else lognormal of this sigma with the same
    # mean, at least tool_min_s (test runs and builds give real tool times a heavy tail).
    tool_sigma: float = 0.0
    # Open arrivals: sessions start over this many seconds (a Poisson process), not within one think time.
    arrival_s: float = 0.0
    # The CPU tier (GiB of host memory, vLLM's native offloading) of AHC, FCFS and vLLM with offload;
    # emulated engine only.
    offload_gib: float = 0.0
    # What a call sends: "context", its new message with AHC's `context` (the server keeps the State);
    # "messages", the whole history, as agent clients do (the only way vanilla vLLM can be served).
    client: str = "context"
    # The sides to run, joined by "+" ("ahc+vllm+offload"; empty: every side the engine has, SIDES).
    sides: str = ""

    def describe(self) -> str:
        calls = (f", {self.calls} model calls a turn (tool results ~{self.tool_words} words after "
                 f"{self.tool_min_s}-{self.tool_max_s} s of tool time)" if self.calls > 1 else "")
        engine = f" on the EMULATED {self.emulate}" if self.emulate else ""
        tools = f", tool times lognormal sigma {self.tool_sigma}" if self.tool_sigma else ""
        arrivals = (f"sessions arriving over {self.arrival_s} s (Poisson)" if self.arrival_s else
                    f"sessions starting within {self.think_max_s} s")
        tier = f"; a {self.offload_gib} GiB CPU tier" if self.offload_gib else ""
        return (f"{self.model}{engine}: {self.sessions} sessions x {self.turns} turns{calls}{tools}, "
                f"think {self.think_min_s}-{self.think_max_s} s "
                f"(seeded), {arrivals}, {self.max_tokens}-token replies (ignore_eos), a shared prefix of "
                f"~{self.shared_words} words, identity ~{self.identity_words} words, "
                f"codex {self.codex_docs} x ~{self.codex_words} words, questions ~{self.question_words} words; "
                f"each call sends {'its whole history' if self.client == 'messages' else 'AHC context'}; "
                f"contexts at the last turn ~{self.cache_multiple}x the KV cache{tier}; {self.rounds} measured "
                "rounds after a warm-up each")


# `ahc bench agents --engine emulated`: coding agents on an emulated H100 serving Llama-3.1-8B. Shaped
# as the GitHub Copilot coding-agent trace describes a session (Azure Public Dataset, 2026: about 4 user
# turns of about 8 model calls, tool time between them, prompts growing as tool results join them,
# about 530 generated tokens a call), scaled down about 4x in turns, reply and prompt so a round takes
# about two minutes here: 2 turns of 8 calls, 128-token replies, ~400-token tool results after 1-3 s
# of tool time (heavy-tailed, mean 2 s), a ~7k-token system prompt of which ~2.7k (2,000 words: the
# agent's instructions and tool schemas) every session shares; sessions arriving over 20 s; every call
# sending the whole history, as agent clients do; the sessions' last contexts 3x the KV cache, a 16 GiB
# CPU tier.
EMULATED_LOAD = AgentLoad(sessions=16, turns=2, calls=8, max_tokens=128, tool_words=300, tool_min_s=1.0,
                          tool_max_s=3.0, tool_sigma=1.0, think_min_s=2.0, think_max_s=4.0, shared_words=2000,
                          identity_words=500, codex_docs=2, codex_words=500, question_words=60,
                          cache_multiple=3.0, rounds=3, arrival_s=20.0, offload_gib=16.0, client="messages",
                          emulate="h100-llama-8b")


def load_from_env(spec: str | None, base: AgentLoad | None = None) -> AgentLoad:
    """`base` (the default load) with the fields named in `spec` ("sessions=4,turns=3") changed."""
    return overridden(base or AgentLoad(), spec, LOAD_ENV)


@dataclass(frozen=True)
class SessionScript:
    """What one session sends, and when: the same for both servers in a given round."""

    session_id: str
    identity: str
    codex: tuple[dict[str, str], ...]
    questions: tuple[str, ...]
    start_s: float
    think_s: tuple[float, ...]
    tool_results: tuple[tuple[str, ...], ...] = ()  # each turn's, one per call after its first
    tool_s: tuple[tuple[float, ...], ...] = ()  # the tool time before each of them

    def messages(self) -> list[list[str]]:
        """Each turn's new message of each call: the question, then the tool results."""
        return [[q, *(self.tool_results[t] if self.tool_results else ())] for t, q in enumerate(self.questions)]

    def context(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "identity": self.identity, "codex": list(self.codex), "mode": "cag"}

    def system(self) -> str:
        """Identity and Codex as one system message, for a client that sends its whole history."""
        return "\n\n".join([self.identity, *(f"## {d['id']}\n{d['text']}" for d in self.codex)])


def words(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def scripts(load: AgentLoad, round_no: int) -> list[SessionScript]:
    """Every session's content and timing for one round. The round's shared prefix (if any), then the
    agent's name, open its Identity, so sessions share only that prefix and no round shares a block with
    another."""
    out = []
    round_rng = np.random.default_rng([load.seed, round_no, SHARED_STREAM])
    shared = f"You are a coding agent of round {round_no}. {words(round_rng, load.shared_words)}\n\n" \
        if load.shared_words else ""
    # Open arrivals: exponential gaps; else staggered starts within one think time (agents do not
    # arrive in lockstep).
    arrivals = np.cumsum(round_rng.exponential(load.arrival_s / load.sessions, load.sessions)) \
        if load.arrival_s else None
    for s in range(load.sessions):
        rng = np.random.default_rng([load.seed, round_no, s])
        identity = shared + f"You are agent {s} of round {round_no}, a careful scientist. " + \
            words(rng, load.identity_words)
        codex = tuple({"id": f"doc{d}", "text": words(rng, load.codex_words)} for d in range(load.codex_docs))
        questions = tuple(f"Turn {t}: " + words(rng, load.question_words) for t in range(load.turns))
        start = float(rng.uniform(0, load.think_max_s)) if arrivals is None else float(arrivals[s])
        think = tuple(float(x) for x in rng.uniform(load.think_min_s, load.think_max_s, load.turns))
        tools = tuple(tuple(f"Tool result {t}.{c}: " + words(rng, load.tool_words) for c in range(1, load.calls))
                      for t in range(load.turns))
        tool_s = tuple(tuple(tool_times(rng, load, load.calls - 1)) for _ in range(load.turns))
        out.append(SessionScript(f"agents-r{round_no}-s{s}", identity, codex, questions, start, think, tools, tool_s))
    return out


SHARED_STREAM = 1 << 20  # the round's own random stream (shared prefix, arrivals), apart from its sessions'


def tool_times(rng: np.random.Generator, load: AgentLoad, n: int) -> list[float]:
    """`n` tool times: uniform over the load's range, or lognormal with the same mean (`tool_sigma`)."""
    if not load.tool_sigma:
        return [float(x) for x in rng.uniform(load.tool_min_s, load.tool_max_s, n)]
    mean = (load.tool_min_s + load.tool_max_s) / 2
    mu = math.log(mean) - load.tool_sigma ** 2 / 2 if mean > 0 else 0.0
    return [max(float(x), load.tool_min_s) for x in rng.lognormal(mu, load.tool_sigma, n)]


def session_tokens_estimate(script: SessionScript, max_tokens: int, count: Callable[[str], int]) -> int:
    """Tokens of the session's last prompt plus its reply: Identity, Codex, every question and every
    reply but the last in State, each message with the template's markers. `count`: text → tokens."""
    system = count(script.identity) + sum(count(f"## {d['id']}\n{d['text']}") for d in script.codex)
    sent = [m for turn in script.messages() for m in turn]
    turns = sum(count(m) for m in sent) + len(sent) * max_tokens
    messages = 2 * len(sent) + 2  # the questions and tool results, the replies, Identity and Codex
    return system + turns + messages * MESSAGE_OVERHEAD_TOKENS


@dataclass(frozen=True)
class CacheSize:
    """The KV cache the servers get, and the window that still lets one session's turn fit in it."""

    blocks: int
    block_size: int
    max_model_len: int
    blocks_for_all: int = 0  # every session's last context at once: the cache that holds everything


def cache_size(sessions: int, session_tokens: int, block_size: int, cache_multiple: float,
               model_max_len: int) -> CacheSize:
    """Blocks so that `sessions` contexts of `session_tokens` are `cache_multiple` times the cache, but
    never fewer than one session's last turn needs (vLLM refuses a window the cache cannot hold)."""
    per_session = math.ceil(session_tokens / block_size)
    blocks = max(math.ceil(sessions * per_session / cache_multiple), per_session + NULL_BLOCKS + SLACK_BLOCKS)
    max_model_len = min(model_max_len, (blocks - NULL_BLOCKS) * block_size)
    if max_model_len < session_tokens:
        raise ValueError(f"a session of {session_tokens} tokens does not fit the model's {model_max_len}-token "
                         "window; shorten the load")
    return CacheSize(blocks, block_size, max_model_len, 2 * sessions * per_session + NULL_BLOCKS + SLACK_BLOCKS)


@dataclass(frozen=True)
class TurnResult:
    """One turn as the client saw it. `ttft_s`: from sending the request that was answered to its first
    token; `wait_s`: from the turn being ready (its first attempt) to that token, 429 back-offs included."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    wait_s: float
    rejections: int = 0
    reply: str = ""  # the reply's text, which a client sending its history sends back


def reusable_tokens(prompt: int, prev_prompt: int, prev_completion: int, block_size: int) -> int:
    """What an ideal prefix cache serves of a turn: the previous request's prompt and reply in whole KV
    blocks (the reply's last token is never written to the cache), as bench/orchestrator.py's ceiling."""
    return min(prompt, (prev_prompt + prev_completion - 1) // block_size * block_size)


def hit_ratio(sessions: Sequence[Sequence[TurnResult]]) -> float:
    """Cached over prompt tokens of every turn after each session's first."""
    later = [t for turns in sessions for t in turns[1:]]
    prompt = sum(t.prompt_tokens for t in later)
    return sum(t.cached_tokens for t in later) / prompt if prompt else 0.0


def hit_ratio_ceiling(sessions: Sequence[Sequence[TurnResult]], block_size: int) -> float:
    """The hit ratio an ideal scheduler with an ideal cache reaches on the same turns."""
    reusable = prompt = 0
    for turns in sessions:
        for prev, turn in zip(turns, turns[1:]):
            reusable += reusable_tokens(turn.prompt_tokens, prev.prompt_tokens, prev.completion_tokens, block_size)
            prompt += turn.prompt_tokens
    return reusable / prompt if prompt else 0.0


@dataclass
class AgentRound:
    """One round on one server: every session's turns, the wall time, and the server's counters' deltas."""

    sessions: list[list[TurnResult]]
    wall_s: float
    counters: dict[str, float] = field(default_factory=dict)
    jct_s: list[float] = field(default_factory=list)  # each session's, from its first call to its last reply

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for turns in self.sessions for t in turns)

    @property
    def tok_per_s(self) -> float:
        return self.completion_tokens / self.wall_s


def side_figures(prefix: str, rounds: Sequence[AgentRound], block_size: int) -> dict[str, float]:
    """One server's figures over its measured rounds: ratios and percentiles over every turn of them,
    tokens per second the median round, counters summed."""
    sessions = [turns for r in rounds for turns in r.sessions]
    turns = [t for ts in sessions for t in ts]
    ttft = [t.ttft_s for t in turns]
    first_ttft = [ts[0].ttft_s for ts in sessions if ts]
    jct = [j for r in rounds for j in r.jct_s]
    round_jct = [statistics.mean(r.jct_s) for r in rounds if r.jct_s]
    counters = summed_counters(rounds)
    buckets = {float(k.removeprefix(WAIT_BUCKET)): v for k, v in counters.items() if k.startswith(WAIT_BUCKET)}
    # Every attempt passes admission, a refused one too; turns let straight in are not observed.
    attempts = len(turns) + sum(t.rejections for t in turns)
    ready_p99 = percentile([t.wait_s for t in turns], 99)
    # A turn's admission wait is part of its client-side wait, so the client's p99 bounds the server's;
    # the cap keeps a wide top bucket (120-300 s) from inventing waits no turn had.
    admission_p99 = min(histogram_quantile(0.99, buckets, attempts), ready_p99)
    prompt = sum(t.prompt_tokens for t in turns)
    return {f"{prefix}hit_ratio": hit_ratio(sessions),
            f"{prefix}hit_ratio_ceiling": hit_ratio_ceiling(sessions, block_size),
            f"{prefix}tok_per_s": statistics.median(r.tok_per_s for r in rounds),
            f"{prefix}preemptions": int(counters.get("preemptions", 0)),
            f"{prefix}ttft_p50_ms": percentile(ttft, 50) * 1e3,
            f"{prefix}ttft_p99_ms": percentile(ttft, 99) * 1e3,
            f"{prefix}ttft_p50_s": percentile(first_ttft, 50),
            f"{prefix}ttft_p99_s": percentile(first_ttft, 99),
            f"{prefix}wait_p99_ms": admission_p99 * 1e3,
            f"{prefix}held_turns": int(counters.get("session_wait_count", 0)),
            f"{prefix}held_s": counters.get("session_wait_sum", 0.0),
            f"{prefix}ready_to_token_p99_ms": ready_p99 * 1e3,
            f"{prefix}429s": sum(t.rejections for t in turns),
            f"{prefix}jct_mean_s": statistics.mean(jct),
            f"{prefix}jct_p50_s": percentile(jct, 50),
            f"{prefix}jct_p99_s": percentile(jct, 99),
            f"{prefix}jct_max_s": max(jct),
            f"{prefix}jct_mean_spread_s": max(round_jct) - min(round_jct),
            f"{prefix}prompt_tokens": prompt,
            f"{prefix}computed_prompt_tokens": prompt - sum(t.cached_tokens for t in turns),
            f"{prefix}device_hit_tokens": int(counters.get(f"{CACHED_BY}device", 0)),
            f"{prefix}host_hit_tokens": int(counters.get(f"{CACHED_BY}host", 0)),
            f"{prefix}load_bytes": int(counters.get("load_bytes", 0)),
            f"{prefix}store_bytes": int(counters.get("store_bytes", 0))}


def summed_counters(rounds: Sequence[AgentRound]) -> dict[str, float]:
    total: dict[str, float] = {}
    for r in rounds:
        for name, value in r.counters.items():
            total[name] = total.get(name, 0.0) + value
    return total


def histogram_quantile(q: float, buckets: dict[float, float], total: float) -> float:
    """The q-quantile of `total` observations of which the histogram's (cumulative counts by upper
    bound) are the non-zero ones, interpolated within a bucket as Prometheus's histogram_quantile does."""
    observed = max(buckets.values(), default=0.0)
    zeros = max(total - observed, 0.0)
    rank = q * (zeros + observed)
    if observed == 0 or rank <= zeros:
        return 0.0
    lower, below = 0.0, zeros
    for bound in sorted(buckets):
        cumulative = zeros + buckets[bound]
        if cumulative >= rank:
            if math.isinf(bound):  # past the last finite bound: that bound is all that is known
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * (rank - below) / inside if inside else bound
        lower, below = bound, cumulative
    return lower


def ratios_of(figures: dict[str, float | int]) -> dict[str, float]:
    def over(a: str, b: str) -> float:
        return safe_ratio(figures[a], figures[b]) if a in figures and b in figures else math.nan

    ratios = {"ahc_hit_over_ceiling": over("ahc_hit_ratio", "hit_ratio_ceiling"),
              "fcfs_hit_over_ceiling": over("fcfs_hit_ratio", "fcfs_hit_ratio_ceiling"),
              "ahc_tok_over_fcfs": over("ahc_tok_per_s", "fcfs_tok_per_s"),
              "ahc_wait_p99_over_fcfs": over("ahc_wait_p99_ms", "fcfs_wait_p99_ms"),
              "fcfs_jct_over_ahc": over("fcfs_jct_mean_s", "ahc_jct_mean_s"),
              "fcfs_jct_p99_over_ahc": over("fcfs_jct_p99_s", "ahc_jct_p99_s"),
              "vllm_jct_over_ahc": over("vllm_jct_mean_s", "ahc_jct_mean_s"),
              "vllm_jct_p99_over_ahc": over("vllm_jct_p99_s", "ahc_jct_p99_s"),
              "offload_jct_over_ahc": over("offload_jct_mean_s", "ahc_jct_mean_s"),
              "offload_jct_p99_over_ahc": over("offload_jct_p99_s", "ahc_jct_p99_s"),
              "ahc_ttft_p99_over_vllm": over("ahc_ttft_p99_s", "vllm_ttft_p99_s"),
              "vllm_hit_over_ceiling": over("vllm_hit_ratio", "vllm_hit_ratio_ceiling"),
              "offload_hit_over_ceiling": over("offload_hit_ratio", "offload_hit_ratio_ceiling"),
              "offload_gain_captured": gain_captured(figures, "offload_")}
    for side in ("ahc", "ahc_priority", "ahc_gpu"):
        suffix = "" if side == "ahc" else side.removeprefix("ahc")
        ratios[f"ahc{suffix}_gain_captured"] = gain_captured(figures, f"{side}_")
        if side != "ahc":
            ratios[f"offload_jct_over_ahc{suffix}"] = over("offload_jct_mean_s", f"{side}_jct_mean_s")
        ratios[f"ahc{suffix}_jct_max_over_offload"] = over(f"{side}_jct_max_s", "offload_jct_max_s")
        if side != "ahc":
            ratios[f"ahc{suffix}_ttft_p99_over_vllm"] = over(f"{side}_ttft_p99_s", "vllm_ttft_p99_s")
    return {name: value for name, value in ratios.items() if math.isfinite(value)}


def gain_captured(figures: dict[str, float | int], prefix: str) -> float:
    """How much of what a cache holding everything saves over vanilla vLLM a side saves: (vLLM - side) /
    (vLLM - ideal), by mean JCT (1: all of it; 0: none; negative: slower than vanilla vLLM)."""
    names = ("vllm_jct_mean_s", f"{prefix}jct_mean_s", "ideal_jct_mean_s")
    if not all(n in figures for n in names):
        return math.nan
    vllm, side, ideal = (float(figures[n]) for n in names)
    return (vllm - side) / (vllm - ideal) if vllm > ideal else math.nan


def safe_ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def combine(sides: dict[str, Sequence[AgentRound]], block_size: int) -> dict[str, float | int]:
    """Every server's figures, each side's name its prefix; `hit_ratio_ceiling` is AHC's turns' (each
    other side's own is beside it: they differ only where a reply's text tokenizes differently in the
    next prompt)."""
    figures: dict[str, float | int] = {}
    for name, rounds in sides.items():
        figures.update(side_figures(f"{name}_", rounds, block_size))
    figures["hit_ratio_ceiling"] = figures.pop("ahc_hit_ratio_ceiling")
    return figures


# ----- the load, against a running server -----

async def send_turn(http: aiohttp.ClientSession, base_url: str, body: dict[str, Any]) -> TurnResult:
    """One streamed chat turn; a 429 waits its Retry-After and is sent again."""
    ready, rejections = time.perf_counter(), 0
    while True:
        sent = time.perf_counter()
        async with http.post(f"{base_url}/v1/chat/completions", json=body) as response:
            if response.status == 429 and rejections < MAX_RETRIES:
                rejections += 1
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            if response.status != 200:
                raise RuntimeError(f"{base_url} answered {response.status}: {(await response.text())[:500]}")
            first, usage, text = None, None, []
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                data = json.loads(line[6:])
                choices = data.get("choices")
                content = choices[0].get("delta", {}).get("content") if choices else None
                if content:
                    first = first if first is not None else time.perf_counter()
                    text.append(content)
                usage = data.get("usage") or usage
        if usage is None:
            raise RuntimeError(f"{base_url}: a streamed reply without usage")
        first = first if first is not None else time.perf_counter()
        details = usage.get("prompt_tokens_details") or {}
        return TurnResult(usage["prompt_tokens"], details.get("cached_tokens") or 0, usage["completion_tokens"],
                          first - sent, first - ready, rejections, "".join(text))


async def run_session(http: aiohttp.ClientSession, base_url: str, model: str, script: SessionScript,
                      max_tokens: int, client: str = "context") -> tuple[list[TurnResult], float]:
    """The session's calls in order, with its tool and think times; its results and its job completion
    time (first call sent to last reply). `client`: AgentLoad.client."""
    await asyncio.sleep(script.start_s)
    results: list[TurnResult] = []
    history: list[dict[str, str]] = [{"role": "system", "content": script.system()}]
    started = time.perf_counter()
    for t, (turn, think) in enumerate(zip(script.messages(), script.think_s)):
        for c, message in enumerate(turn):
            if c:
                await asyncio.sleep(script.tool_s[t][c - 1])  # the tool runs; the session's KV waits
            body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                                    "stream": True, "stream_options": {"include_usage": True}}
            history.append({"role": "user", "content": message})
            if client == "messages":
                body["messages"] = list(history)
            else:
                body.update(messages=[history[-1]], context=script.context())
            results.append(await send_turn(http, base_url, body))
            history.append({"role": "assistant", "content": results[-1].reply})
        if t < len(script.questions) - 1:
            await asyncio.sleep(think)
    return results, time.perf_counter() - started


async def run_sessions(base_url: str, model: str, load: AgentLoad,
                       round_no: int) -> tuple[list[tuple[list[TurnResult], float]], float]:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        started = time.perf_counter()
        sessions = await asyncio.gather(*(run_session(http, base_url, model, s, load.max_tokens, load.client)
                                          for s in scripts(load, round_no)))
        return list(sessions), time.perf_counter() - started


# vLLM's counters a side reports, by the name they are kept under.
ENGINE_COUNTERS = {"vllm:num_preemptions_total": "preemptions", "vllm:kv_offload_load_bytes_total": "load_bytes",
                   "vllm:kv_offload_store_bytes_total": "store_bytes"}
CACHED_BY = "cached_by:"  # vllm:prompt_tokens_cached_by_source, by its source (device, host)


def server_counters(base_url: str) -> dict[str, float]:
    """The engine's preemptions, cached tokens by tier and offload bytes, the governor's actions and the
    admission-wait histogram, each summed over its series."""
    from prometheus_client.parser import text_string_to_metric_families

    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name in ENGINE_COUNTERS:
                key = ENGINE_COUNTERS[sample.name]
                counters[key] = counters.get(key, 0.0) + sample.value
            elif sample.name == "vllm:prompt_tokens_cached_by_source_total":
                key = f"{CACHED_BY}{sample.labels.get('source', '?')}"
                counters[key] = counters.get(key, 0.0) + sample.value
            elif sample.name == "ahc_governor_actions_total":
                key = f"governor:{sample.labels.get('action', '?')}"
                counters[key] = counters.get(key, 0.0) + sample.value
            elif sample.name.startswith(WAIT_HISTOGRAM):
                suffix = sample.name.removeprefix(WAIT_HISTOGRAM)
                name = {"_bucket": f"{WAIT_BUCKET}{sample.labels.get('le')}", "_sum": "session_wait_sum",
                        "_count": "session_wait_count"}.get(suffix)
                if name is not None:
                    counters[name] = counters.get(name, 0.0) + sample.value
    return counters


@dataclass
class Side:
    """One server under the agents' load; its rounds count up so every server sees the same scripts."""

    name: str
    server: ServerProcess
    model: str
    load: AgentLoad
    rounds_run: int = 0

    def measure(self) -> AgentRound:
        import uvloop

        before = server_counters(self.server.base_url)
        sessions, wall = uvloop.run(run_sessions(self.server.base_url, self.model, self.load, self.rounds_run))
        after = server_counters(self.server.base_url)
        self.rounds_run += 1
        return AgentRound([turns for turns, _ in sessions], wall,
                          {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after.keys() | before},
                          [jct for _, jct in sessions])


# ----- the servers -----

def switch_available() -> bool:
    """Whether this build's config knows the session-aware admission switch (FCFS needs it off)."""
    return SWITCH in OrchestratorConfig.model_fields


def start_sides(model_dir: Path, tmp: Path, size: CacheSize, load: AgentLoad,
                fcfs_env: dict[str, str]) -> dict[str, ServerProcess]:
    """The servers, started together (start-up is mostly waiting; one failing stops the others): AHC and
    FCFS; on the emulated engine also vanilla `vllm serve`, `vllm serve` with the same CPU tier as AHC's
    (if any), and the ideal, vanilla vLLM on a cache that holds every session."""
    extra = ["--max-model-len", str(size.max_model_len), "--num-gpu-blocks-override", str(size.blocks)]
    tier: list[str] = []
    if load.emulate:
        # Every side schedules as vLLM would on that GPU, not as the bundled CPU config does.
        tokens, seqs = gpu_batch_defaults(profile(load.emulate).gpu)
        extra += ["--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(tokens)]
        if load.offload_gib:
            tier = ["--kv-offloading-size", str(load.offload_gib), "--kv-offloading-backend", "native"]
    # Threshold compaction off: every turn appends to State, which the ceiling assumes; the governor
    # may still compact a State to admit a turn, as it would for any agent.
    common = {"AHC_ORCHESTRATOR__COMPACTION_THRESHOLD_TOKENS": str(size.max_model_len)}
    ahc_extra = [*extra, *tier, *(["--emulate", load.emulate] if load.emulate else [])]
    envs = {"ahc": common, "fcfs": {**common, **fcfs_env}}
    if load.emulate:  # the ablations: program order alone, and return order on the GPU as well
        envs |= {"ahc_priority": {**common, "AHC_ENGINE__RETURN_ORDER": "off"},
                 "ahc_gpu": {**common, "AHC_ENGINE__RETURN_ORDER": "both"}}
    starts: dict[str, Callable[[], ServerProcess]] = {
        name: partial(start_server, tmp / name / "xdb", model=model_dir, lens="off", extra=ahc_extra, env=env)
        for name, env in envs.items()}
    if load.emulate:
        vllm = partial(start_vllm, model_dir, max_model_len=size.max_model_len, emulate=load.emulate)
        starts["vllm"] = partial(vllm, tmp / "vllm", extra=extra)
        if tier:
            starts["offload"] = partial(vllm, tmp / "offload", extra=[*extra, *tier])
        everything = ["--num-gpu-blocks-override", str(size.blocks_for_all)]
        starts["ideal"] = partial(vllm, tmp / "ideal", extra=[*extra, *everything])
    chosen = chosen_sides(load)
    if chosen:
        starts = {name: start for name, start in starts.items() if name in chosen}
    return dict(zip(starts, start_together(list(starts.values()))))


def chosen_sides(load: AgentLoad) -> list[str]:
    """The sides the load names (AgentLoad.sides), checked; empty: every side."""
    chosen = [name.strip() for name in load.sides.split("+") if name.strip()]
    if chosen and "ahc" not in chosen:
        raise ValueError(f"{LOAD_ENV}: sides must include ahc, the side every ratio is of")
    unknown = [name for name in chosen if name not in SIDES]
    if unknown:
        raise ValueError(f"{LOAD_ENV}: unknown side {unknown[0]!r}; choose from {', '.join(SIDES)}")
    return chosen


def sizing(model_dir: Path, load: AgentLoad, block_size: int) -> tuple[CacheSize, int]:
    """The cache for this load, and the estimated tokens of one session's last turn it is sized from."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    tokens = max(session_tokens_estimate(s, load.max_tokens, count) for s in scripts(load, 0))
    window = profile(load.emulate).model.max_position if load.emulate else model_max_len(model_dir)
    return cache_size(load.sessions, tokens, block_size, load.cache_multiple, window), tokens


def run(load: AgentLoad | None = None, emulated: bool = False) -> BenchResult:
    """`emulated`: EMULATED_LOAD, not AgentLoad(), is what the environment's fields change."""
    load = load or load_from_env(os.environ.get(LOAD_ENV), EMULATED_LOAD if emulated else None)
    if load.model not in MODELS:
        raise ValueError(f"{LOAD_ENV}: unknown model {load.model!r}; choose from {', '.join(MODELS)}")
    if load.client not in CLIENTS:
        raise ValueError(f"{LOAD_ENV}: unknown client {load.client!r}; choose from {', '.join(CLIENTS)}")
    if load.emulate and load.client != "messages":
        raise ValueError(f"{LOAD_ENV}: vanilla vLLM knows no `context`: the emulated sides need client=messages")
    if load.offload_gib and not load.emulate:
        raise ValueError(f"{LOAD_ENV}: offload_gib needs the emulated engine (vLLM's CPU build has no CPU tier)")
    chosen_sides(load)
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
            measured = alternating_rounds([side.measure for side in sides], load.rounds)
        finally:
            for server in servers.values():
                server.stop()
    return result_of(load, size, estimate, dict(zip(servers, measured)), switch)


CLIENTS = ("context", "messages")


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


AHC_SIDES = ("ahc", "fcfs", "ahc_priority", "ahc_gpu")
SIDES = {"ahc": "AHC, session-aware admission, program order (priority), expected-return eviction in the "
                "CPU tier (engine.return_order cpu, the defaults)",
         "fcfs": "AHC, first come first served",
         "ahc_priority": "AHC with program order alone (engine.return_order off)",
         "ahc_gpu": "AHC with the GPU's free blocks in return order too (engine.return_order both)",
         "vllm": "vanilla vllm serve", "offload": "vllm serve with native CPU offload, the same tier as AHC's",
         "ideal": "vanilla vllm serve on a cache that holds every session"}


def governor_actions(rounds: Sequence[AgentRound]) -> str:
    counts = {k.split(":", 1)[1]: v for k, v in summed_counters(rounds).items() if k.startswith("governor:")}
    return ", ".join(f"{k} {int(v)}" for k, v in sorted(counts.items()) if v) or "none"
