"""`ahc bench long-session`: one coding agent's session of hundreds of tool calls, its history passing
the window many times over, through AHC and through two ordinary clients of vLLM's own server.

The same seeded script for all three (bench/agent_script.py): each turn the model must call a named
tool (`tool_choice`; the grammar makes a random model's call valid), the fake tool answers with a
source file, grep output, a test log, a listing or a diff of 100-1500 tokens, and every few turns the
user adds an instruction. Clients (bench/session_clients.py):

- ahc: AHC with `context` (session id, Identity, a small Codex, mode auto): it sends only the new
  messages; the server keeps the State and compacts it when it grows.
- client: a well-behaved client on vLLM's own api_server (bench/serve.py, AHC's engine flags): a stable
  system prompt (Identity + the same Codex), its whole history resent, the oldest turn groups dropped,
  as few as fit, when the window is full (bench/history_trim.py).
- naive: the same with the current time at the top of its system prompt.

Both servers start together and stay up; the clients run one after the other (AHC, client, naive), each
alone on its server. Per client: prefill tokens as the engine computed them (vLLM's
`prefix_cache_queries` less `prefix_cache_hits` over the client's run, so AHC's own compaction and
condensing calls count) and as the responses show them (prompt less cached tokens), the hit ratio
(cached over prompt tokens), TTFT p50/p99 (streamed, to the first token of the call). For AHC: the
compactions and mode switches its reports name, and the ceiling an ideal prefix cache reaches on its
turns given the breaks its own blocks report.

The load is `LOADS` (bench/load.py): `BENCH_LONG_SESSION_LOAD="smoke"` or e.g.
`"turns=12,max_model_len=2048,model=tiny"`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.agent_script import AgentScript, ScriptSpec, build_script
from bench.device import engine_device
from bench.history_trim import Count
from bench.load import DEFAULT, SMOKE, Loads
from bench.models import MODELS, model_max_len
from bench.prefix_ceiling import reusable_tokens as ceiling_tokens
from bench.result import BenchResult
from bench.serve import start_vllm
from bench.servers import TINY_MODEL, ensure_model, scrape_metrics, start_server, start_together, stop_together
from bench.session_clients import (
    Client,
    ContextClient,
    HistoryClient,
    MeasuredTurn,
    Sampling,
    run_turns,
    template_counter,
    whitespace_bias,
)
from bench.stream_load import percentile
from core.config import cache_dir, load_config
from server.cluster.server_process import ServerProcess

TINY = "tiny"
# A tool result takes at most this share of the room the window leaves after the system prompt and
# the reply, so a small window (a smoke run) still fits a turn.
RESULT_ROOM_SHARE = 0.5
BEFORE_STATE = ("identity", "codex", "karma")  # blocks whose change breaks the prefix before the State
# Governor actions that rewrite the State (not only append to it).
STATE_REWRITES = ("compaction", "vram_compact", "ctc_depth", "ctc_prune_filler", "ctc_prune_turns")
QUEUE = ("vllm:num_requests_running", "vllm:num_requests_waiting")
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
IDLE_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 900
GOAL_PREFILL_SHARE = 0.25
GOAL_HIT_RATIO = 0.9


@dataclass(frozen=True)
class LongSessionLoad:
    """The session's length, the window, the model, and the script's sizes."""

    turns: int = 200
    max_model_len: int = 8192
    model: str = "bench-6x512"  # one of bench/models.py's, or "tiny" (the tests' model, window 2048)
    max_tokens: int = 64  # a forced call takes 37-55 tokens of this tokenizer, envelope and end included
    result_min_tokens: int = 100
    result_max_tokens: int = 1500
    user_every: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model != TINY and self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose from {TINY}, {', '.join(MODELS)}")

    def script_spec(self, system_tokens: int = 0) -> ScriptSpec:
        """The script's sizes, tool results capped by the room a `system_tokens` prompt leaves."""
        room = self.max_model_len - self.max_tokens - system_tokens
        largest = max(min(self.result_max_tokens, int(room * RESULT_ROOM_SHARE)), 1)
        return ScriptSpec(self.turns, self.seed, min(self.result_min_tokens, largest), largest, self.user_every)

    def describe(self, spec: ScriptSpec) -> str:
        return (f"{self.turns} turns on {self.model}, window {self.max_model_len}, {self.max_tokens}-token "
                f"replies (a forced tool call), tool results {spec.result_min_tokens}-{spec.result_max_tokens} "
                f"tokens (log-uniform, seed {self.seed}), a user instruction every {self.user_every} turns")


LOADS = Loads("long-session", {DEFAULT: LongSessionLoad(),
                               SMOKE: LongSessionLoad(turns=12, max_model_len=2048, model=TINY)})


# ----- what the runs measure -----

@dataclass(frozen=True)
class ClientRun:
    """One client's session: its turns, the engine's prefill over the run, and its wall time."""

    turns: list[MeasuredTurn]
    engine_prefill: int
    wall_s: float

    @property
    def prompt_tokens(self) -> int:
        return sum(t.reply.prompt_tokens for t in self.turns)

    @property
    def cached_tokens(self) -> int:
        return sum(t.reply.cached_tokens for t in self.turns)

    def reports(self) -> list[dict[str, Any]]:
        return [t.reply.report or {} for t in self.turns]


def break_block(report: dict[str, Any]) -> str | None:
    """The block where the prompt stopped extending the previous one, where the report shows it: the
    first changed block when it lies before the State (a compaction's summary in Karma, a mode switch in
    the Codex), else the State itself when the turn rewrote it (a compaction whose summary came out the
    same, turns the governor dropped); None when the State only grew."""
    changed = report.get("first_changed_block")
    if changed in BEFORE_STATE:
        return str(changed)
    if any(str(action).split(":")[0] in STATE_REWRITES for action in report.get("governor") or []):
        return "state"
    return None


def reusable_tokens(prompt: int, prev_prompt: int, prev_completion: int, report: dict[str, Any],
                    block_size: int) -> int:
    """What an ideal prefix cache serves of a turn (bench/prefix_ceiling.py); after a break
    (`break_block`), only what comes before the broken block. That prefix is the prompt less the broken
    block and every block after it: the chat template's own tokens (the tools' schemas first) precede
    the Identity and are in no block."""
    broken = break_block(report)
    names = [b["name"] for b in report.get("blocks", [])]
    if broken in names:
        after = sum(b["tokens"] for b in report["blocks"][names.index(broken):])
        prompt = max(prompt - after, 0)
        return ceiling_tokens(prompt, prev_prompt, prev_completion, block_size) // block_size * block_size
    return max(ceiling_tokens(prompt, prev_prompt, prev_completion, block_size), 0)


def hit_ratio_ceiling(turns: Sequence[MeasuredTurn], block_size: int) -> float:
    """Reusable over prompt tokens across the session (the first turn reuses nothing)."""
    replies = [t.reply for t in turns]
    reusable = sum(reusable_tokens(r.prompt_tokens, p.prompt_tokens, p.completion_tokens, r.report or {}, block_size)
                   for p, r in zip(replies, replies[1:]))
    prompt = sum(r.prompt_tokens for r in replies)
    return reusable / prompt if prompt else 0.0


def compactions(reports: Sequence[dict[str, Any]]) -> int:
    return sum(1 for r in reports for action in r.get("governor") or [] if action.split(":")[0] == "compaction")


def mode_switches(reports: Sequence[dict[str, Any]]) -> int:
    """The last report's own count where it gives one, else the changes of mode from turn to turn."""
    if reports and "mode_switches" in reports[-1]:
        return int(reports[-1]["mode_switches"])
    modes = [r.get("mode") for r in reports]
    return sum(1 for a, b in zip(modes, modes[1:]) if a != b)


def side_figures(prefix: str, run: ClientRun) -> dict[str, float | int]:
    ttft = [t.reply.ttft_s for t in run.turns]
    prompt = run.prompt_tokens
    return {f"{prefix}prefill_tokens": run.engine_prefill,
            f"{prefix}visible_prefill_tokens": prompt - run.cached_tokens,
            f"{prefix}prompt_tokens": prompt,
            f"{prefix}hit_ratio": run.cached_tokens / prompt if prompt else 0.0,
            f"{prefix}ttft_p50_ms": percentile(ttft, 50) * 1e3,
            f"{prefix}ttft_p99_ms": percentile(ttft, 99) * 1e3,
            f"{prefix}wall_s": run.wall_s}


# ----- the servers -----

def model_dir_of(load: LongSessionLoad) -> Path:
    if load.model == TINY:
        return ensure_model(TINY_MODEL)
    return ensure_model(cache_dir() / "models" / load.model, *MODELS[load.model])


def check_window(model_dir: Path, max_model_len: int) -> None:
    longest = model_max_len(model_dir)
    if max_model_len > longest:
        raise ValueError(f"{LOADS.env}: max_model_len {max_model_len} is past the model's {longest} positions")


def start_both(model_dir: Path, tmp: Path, max_model_len: int) -> tuple[ServerProcess, ServerProcess]:
    """AHC (lens off: no capture cost in the engine) and vLLM's own server, started together (start-up
    is mostly waiting); one failing stops the other."""
    starts: list[Callable[[], ServerProcess]] = [
        lambda: start_server(tmp / "ahc" / "xdb", model=model_dir, lens="off",
                             extra=["--max-model-len", str(max_model_len)]),
        lambda: start_vllm(model_dir, tmp / "vllm", max_model_len=max_model_len)]
    ahc, vllm = start_together(starts)
    return ahc, vllm


def engine_counters(base_url: str) -> dict[str, float]:
    return scrape_metrics(base_url, summed=("vllm:",))


def idle_counters(base_url: str) -> dict[str, float]:
    """The engine's counters once nothing runs or waits: a summary or condensing call the server made
    on its own after the last reply counts with the run that caused it."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        counters = engine_counters(base_url)
        if sum(counters.get(name, 0.0) for name in QUEUE) == 0 or time.monotonic() > deadline:
            return counters
        time.sleep(0.5)


def measured(client: Client, base_url: str, turns: int) -> ClientRun:
    before = idle_counters(base_url)
    done, wall = run_turns(client, turns)
    after = idle_counters(base_url)
    queries, hits = (after[name] - before[name] for name in COUNTERS)
    return ClientRun(done, int(queries - hits), wall)


# ----- the bench -----

def run(load: LongSessionLoad) -> BenchResult:
    model_dir = model_dir_of(load)
    check_window(model_dir, load.max_model_len)
    block_size = load_config("cpu-tiny").engine.block_size or 16
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # It only counts here: a history over the window is measured, then trimmed, never fed to a model.
    tokenizer.model_max_length = sys.maxsize
    count = template_counter(tokenizer)
    script = sized_script(load, count)
    with tempfile.TemporaryDirectory() as tmp:
        ahc, vllm = start_both(model_dir, Path(tmp), load.max_model_len)
        try:
            runs, history_clients = run_clients(ahc, vllm, script, load, count, whitespace_bias(tokenizer))
        finally:
            stop_together((ahc, vllm))
    return result_of(load, script, runs, history_clients, block_size, tokenizer)


def sized_script(load: LongSessionLoad, count: Count) -> AgentScript:
    """The load's script, its tool results capped by the room its system prompt (tools included) leaves;
    the sizes never change the system prompt, so a first build measures it."""
    system = build_script(load.script_spec()).system_prompt()
    return build_script(load.script_spec(count([{"role": "system", "content": system}])))


def run_clients(ahc: ServerProcess, vllm: ServerProcess, script: AgentScript, load: LongSessionLoad,
                count: Count, logit_bias: dict[str, int]) -> tuple[dict[str, ClientRun], dict[str, HistoryClient]]:
    runs: dict[str, ClientRun] = {}
    history: dict[str, HistoryClient] = {}
    with httpx.Client(base_url=ahc.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        sampling = Sampling(http.get("/v1/models").json()["data"][0]["id"], load.max_tokens, logit_bias)
        runs["ahc"] = measured(ContextClient(http, sampling, script), ahc.base_url, load.turns)
    with httpx.Client(base_url=vllm.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        sampling = Sampling(http.get("/v1/models").json()["data"][0]["id"], load.max_tokens, logit_bias)
        for name, naive in (("client", False), ("naive", True)):
            history[name] = HistoryClient(http, sampling, script, load.max_model_len, count, naive)
            runs[name] = measured(history[name], vllm.base_url, load.turns)
    return runs, history


def result_of(load: LongSessionLoad, script: AgentScript, runs: dict[str, ClientRun],
              history: dict[str, HistoryClient], block_size: int, tokenizer: Any) -> BenchResult:
    ahc, client, naive = runs["ahc"], runs["client"], runs["naive"]
    reports = ahc.reports()
    figures: dict[str, float | int] = {**side_figures("ahc_", ahc), **side_figures("client_", client),
                                       **side_figures("naive_", naive)}
    figures.update(mode_switches=mode_switches(reports), compactions=compactions(reports),
                   ahc_hit_ratio_ceiling=hit_ratio_ceiling(ahc.turns, block_size), turns=load.turns,
                   max_model_len=load.max_model_len, max_tokens=load.max_tokens, block_size=block_size,
                   client_trims=history["client"].trims, client_dropped_groups=history["client"].dropped_groups)
    ratios = {f"{name}_prefill_over_ahc": figures[f"{name}_prefill_tokens"] / max(ahc.engine_prefill, 1)
              for name in ("client", "naive")}
    notes = {"model": f"{load.model} ({'the tests’ tiny model' if load.model == TINY else 'ahc tiny-model'}), "
                      "random weights", "device": engine_device(),
             "load": load.describe(script.spec),
             "script": script_sizes(script, tokenizer, load.max_model_len),
             "servers": "AHC (lens off) and vLLM's own api_server with AHC's engine flags, started together; the "
                        "clients ran one after the other (ahc, client, naive), each alone on its server",
             "prefill": "*_prefill_tokens: vllm:prefix_cache_queries less vllm:prefix_cache_hits over the client's "
                        "run (AHC's own summary and condensing calls included); *_visible_prefill_tokens: "
                        "usage prompt_tokens less cached_tokens of the client's requests",
             "ceiling": "per turn, the prompt before first_changed_block (the tools' schemas included) when that "
                        "block lies before the State, before the State when a compaction or the governor rewrote "
                        "it, else the previous prompt and reply; in whole KV blocks, over all prompt tokens",
             "trimming": f"client: {history['client'].trims} turns trimmed, {history['client'].dropped_groups} turn "
                         f"groups dropped; prompt counted with the chat template, largest miscount "
                         f"{miscount(client.turns)} tokens (client), {miscount(naive.turns)} (naive)",
             "ahc_first_changed_block": first_changed_counts(reports),
             "ahc_modes": ", ".join(f"{m} {n}" for m, n in Counter(r.get("mode") for r in reports).items()),
             "ahc_cached_over_prompt_per_turn": " ".join(f"{t.reply.cached_tokens}/{t.reply.prompt_tokens}"
                                                         for t in ahc.turns),
             "goal": goal(figures)}
    return BenchResult("long-session", figures, ratios, notes)


def miscount(turns: Sequence[MeasuredTurn]) -> int:
    return max((abs(t.reply.prompt_tokens - t.counted_tokens) for t in turns if t.counted_tokens is not None),
               default=0)


def first_changed_counts(reports: Sequence[dict[str, Any]]) -> str:
    counts = Counter(str(r.get("first_changed_block")) for r in reports)
    return ", ".join(f"{name} {n}" for name, n in counts.most_common())


def script_sizes(script: AgentScript, tokenizer: Any, window: int) -> str:
    results = [len(tokenizer.encode(t.tool_result, add_special_tokens=False))
               for t in script.turns if t.tool_result is not None]
    total = sum(results) + sum(len(tokenizer.encode(t.instruction, add_special_tokens=False))
                               for t in script.turns if t.instruction is not None)
    spread = (f"tool results {min(results)}/{statistics.median(results):.0f}/{max(results)} tokens (min/median/max)"
              if results else "no tool results")
    return f"{spread}; the script's messages add up to {total} tokens, {total / window:.1f} windows"


def goal(figures: dict[str, float | int]) -> str:
    share = figures["ahc_prefill_tokens"] / max(figures["client_prefill_tokens"], 1)
    met = share <= GOAL_PREFILL_SHARE and figures["ahc_hit_ratio"] >= GOAL_HIT_RATIO
    return (f"AHC prefills <= {GOAL_PREFILL_SHARE}x the well-behaved client's tokens and hits >= {GOAL_HIT_RATIO}: "
            f"{'met' if met else 'not met'} (this run: {share:.3f}x, hit ratio {figures['ahc_hit_ratio']:.3f})")
