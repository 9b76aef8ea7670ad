"""The agents bench's figures: each side's over its measured rounds (hit ratio and its ceiling, tokens/s,
JCT, TTFT, admission waits, the engine's counters), and the ratios between the sides."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.prefix_ceiling import reusable_tokens
from bench.stream_load import percentile

WAIT_BUCKET = "session_wait_le:"
CACHED_BY = "cached_by:"  # vllm:prompt_tokens_cached_by_source, by its source (device, host)


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


def governor_actions(rounds: Sequence[AgentRound]) -> str:
    counts = {k.split(":", 1)[1]: v for k, v in summed_counters(rounds).items() if k.startswith("governor:")}
    return ", ".join(f"{k} {int(v)}" for k, v in sorted(counts.items()) if v) or "none"
