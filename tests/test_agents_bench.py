"""`ahc bench agents`: the hit ratio and its ceiling, the cache sizing, the load's scripts and the
result's figures and ratios computed right without an engine; and one short real run of the command."""

from __future__ import annotations

import json
import math

import pytest
from bench_smoke import run_bench

from bench.agents import result_of
from bench.agents.cache import CacheSize, cache_size
from bench.agents.figures import (
    AgentRound,
    TurnResult,
    histogram_quantile,
    hit_ratio,
    hit_ratio_ceiling,
)
from bench.agents.load import LOADS, AgentLoad
from bench.agents.scripts import scripts, session_tokens_estimate
from bench.prefix_ceiling import reusable_tokens
from bench.registry import BENCHES

FIGURES = {"ahc_hit_ratio", "fcfs_hit_ratio", "hit_ratio_ceiling", "ahc_tok_per_s", "fcfs_tok_per_s",
           "ahc_preemptions", "ahc_wait_p99_ms", "fcfs_preemptions", "fcfs_wait_p99_ms", "ahc_ttft_p50_ms",
           "ahc_ttft_p99_ms", "fcfs_ttft_p50_ms", "fcfs_ttft_p99_ms", "ahc_429s", "fcfs_429s",
           "fcfs_hit_ratio_ceiling", "ahc_held_turns", "ahc_held_s", "ahc_ready_to_token_p99_ms",
           "fcfs_ready_to_token_p99_ms"}
RATIOS = {"ahc_hit_over_ceiling", "ahc_tok_over_fcfs"}


def turn(prompt: int, cached: int = 0, completion: int = 16, ttft: float = 0.1, wait: float | None = None,
         rejections: int = 0) -> TurnResult:
    return TurnResult(prompt, cached, completion, ttft, ttft if wait is None else wait, rejections)


def test_reusable_tokens_are_the_previous_request_in_whole_blocks() -> None:
    # 100 prompt + 16 reply tokens: 115 have KV (the last reply token never does), 96 in whole blocks.
    assert reusable_tokens(150, 100, 16, 32) == 96
    # Never more than the new prompt (a compacted State is shorter than the last request).
    assert reusable_tokens(60, 100, 16, 32) == 60
    # Exactly a block's worth plus the unwritten last token: the block is whole.
    assert reusable_tokens(200, 17, 16, 32) == 32
    assert reusable_tokens(200, 16, 16, 32) == 0


def test_hit_ratio_and_ceiling_leave_out_each_sessions_first_turn() -> None:
    a = [turn(400, cached=0), turn(500, cached=384), turn(600, cached=480)]
    b = [turn(300, cached=0), turn(350, cached=0)]
    # The first turns' 700 prompt tokens count in neither figure.
    assert hit_ratio([a, b]) == pytest.approx((384 + 480) / (500 + 600 + 350))
    # Ceilings: a: 415 -> 384, 515 -> 512; b: 315 -> 288.
    assert hit_ratio_ceiling([a, b], 32) == pytest.approx((384 + 512 + 288) / (500 + 600 + 350))
    assert hit_ratio([[turn(10)]]) == 0.0 and hit_ratio_ceiling([[turn(10)]], 32) == 0.0


def test_cache_is_the_load_over_its_multiple_but_holds_one_session() -> None:
    # 16 sessions of 1000 tokens: 32 blocks each, 512 together, a third of that.
    size = cache_size(16, 1000, 32, 3.0, 4096)
    assert size == CacheSize(blocks=171, block_size=32, max_model_len=4096, blocks_for_all=2 * 512 + 1 + 2)
    # Two sessions would need a cache smaller than one of them: one session's blocks, the null block, slack.
    small = cache_size(2, 1000, 32, 3.0, 4096)
    assert small.blocks == 32 + 1 + 2
    assert small.max_model_len == (small.blocks - 1) * 32 >= 1000
    with pytest.raises(ValueError, match="does not fit"):
        cache_size(4, 5000, 32, 3.0, 4096)


def test_scripts_are_seeded_distinct_and_within_the_think_time() -> None:
    load = AgentLoad(sessions=3, turns=4)
    first, again, other_round = scripts(load, 0), scripts(load, 0), scripts(load, 1)
    assert first == again
    # No two sessions, nor the same session in two rounds, start their prompt alike.
    openings = {s.identity.split(",")[0] for s in first + other_round}
    assert len(openings) == 6 and len({s.session_id for s in first + other_round}) == 6
    for script in first:
        assert len(script.questions) == len(script.think_s) == 4
        assert all(load.think_min_s <= t <= load.think_max_s for t in script.think_s)
        assert 0 <= script.start_s <= load.think_max_s
        assert script.context()["session_id"] == script.session_id


def test_session_estimate_counts_every_turn_and_reply() -> None:
    script = scripts(AgentLoad(sessions=1, turns=3), 0)[0]

    def count(text: str) -> int:
        return len(text.split())

    base = session_tokens_estimate(script, 0, count)
    assert session_tokens_estimate(script, 24, count) == base + 3 * 24
    assert base > count(script.identity) + sum(count(q) for q in script.questions)


def test_load_from_env_overrides_named_fields() -> None:
    assert LOADS.parse(None) == AgentLoad()
    load = LOADS.parse("sessions=4, turns=3,think_max_s=0.6")
    assert (load.sessions, load.turns, load.think_max_s) == (4, 3, 0.6)
    assert isinstance(load.sessions, int) and isinstance(load.think_max_s, float)
    assert load.model == "bench-2x64" and LOADS.parse("model=bench-6x512").model == "bench-6x512"
    with pytest.raises(ValueError, match="unknown field 'session'"):
        LOADS.parse("session=4")


def test_histogram_quantile_counts_the_unobserved_as_zero() -> None:
    # 10 turns, 3 held: one up to 0.5 s, two in (0.5, 1] s. The p99 rank 9.9 falls 1.9/2 into (0.5, 1].
    buckets = {0.5: 1.0, 1.0: 3.0, math.inf: 3.0}
    assert histogram_quantile(0.99, buckets, 10) == pytest.approx(0.975)
    assert histogram_quantile(0.5, buckets, 10) == 0.0
    assert histogram_quantile(0.99, {}, 10) == 0.0
    # Past the last finite bound only that bound is known.
    assert histogram_quantile(0.99, {30.0: 0.0, math.inf: 2.0}, 2) == 30.0


HELD = {"session_wait_le:0.5": 0.0, "session_wait_le:1.0": 2.0, "session_wait_le:+Inf": 2.0,
        "session_wait_sum": 1.5, "session_wait_count": 2.0}


def rounds_of(cached: int, wall: float, preemptions: float, rejections: int = 0,
              held: dict[str, float] | None = None, jct: tuple[float, float] = (1.0, 1.0),
              counters: dict[str, float] | None = None) -> list[AgentRound]:
    sessions = [[turn(400), turn(500, cached=cached, wait=2.1, rejections=rejections), turn(600, cached=cached)]
                for _ in range(2)]
    counters = {"preemptions": preemptions, "governor:vram_queue": 1.0, **(held or {}), **(counters or {})}
    return [AgentRound(sessions, wall, counters, list(jct))]


def test_result_has_every_figure_and_consistent_ratios() -> None:
    load = AgentLoad(sessions=2, turns=3, rounds=1)
    size = CacheSize(blocks=40, block_size=32, max_model_len=1248)
    result = result_of(load, size, 700, {"ahc": rounds_of(384, 2.0, 0, held=HELD, jct=(10.0, 12.0)),
                                         "fcfs": rounds_of(96, 4.0, 3, rejections=1, jct=(15.0, 18.0))}, switch=True)
    assert result.bench == "agents"
    assert FIGURES <= result.figures.keys() and RATIOS <= result.ratios.keys()
    figures, ratios = result.figures, result.ratios
    assert all(math.isfinite(v) for v in figures.values())
    assert figures["ahc_hit_ratio"] == pytest.approx(2 * 384 / 1100)
    assert figures["hit_ratio_ceiling"] == pytest.approx((384 + 512) / 1100)
    assert ratios["ahc_hit_over_ceiling"] == pytest.approx(figures["ahc_hit_ratio"] / figures["hit_ratio_ceiling"])
    # 6 turns x 16 tokens in 2 s against 4 s.
    assert figures["ahc_tok_per_s"] == pytest.approx(48) and ratios["ahc_tok_over_fcfs"] == pytest.approx(2)
    assert (figures["ahc_preemptions"], figures["fcfs_preemptions"]) == (0, 3)
    # Job completion: each session's first call to its last reply; FCFS's jobs took 1.5x AHC's on average.
    assert (figures["ahc_jct_mean_s"], figures["fcfs_jct_mean_s"]) == (11.0, 16.5)
    assert ratios["fcfs_jct_over_ahc"] == pytest.approx(1.5)
    assert ratios["fcfs_jct_p99_over_ahc"] == pytest.approx(figures["fcfs_jct_p99_s"] / figures["ahc_jct_p99_s"])
    assert (figures["ahc_429s"], figures["fcfs_429s"]) == (0, 2)
    # The server's admission wait: 6 turns, 2 held in (0.5, 1] s, the p99 rank 5.94 1.94/2 into it.
    assert figures["ahc_wait_p99_ms"] == pytest.approx(500 + 500 * 1.94 / 2)
    assert (figures["ahc_held_turns"], figures["ahc_held_s"]) == (2, 1.5)
    assert (figures["fcfs_wait_p99_ms"], figures["fcfs_held_turns"]) == (0.0, 0)
    # The client's wait includes a 429's back-off; TTFT is the answered request's own.
    assert figures["fcfs_ready_to_token_p99_ms"] > 2000 > figures["fcfs_ttft_p99_ms"]
    assert figures["cache_multiple"] == pytest.approx(2 * 20 / 39)  # 616 tokens: 20 blocks each
    assert "vram_queue 1" in result.notes["governor"]
    json.loads(result.to_json())
    unswitched = result_of(load, size, 700, {"ahc": rounds_of(384, 2.0, 0), "fcfs": rounds_of(96, 4.0, 3)},
                           switch=False)
    assert "same policy" in unswitched.notes["fcfs"]
    # Held in (10, 30] s by the histogram, but no turn waited more than 2.1 s at the client: the cap.
    wide = {"session_wait_le:10.0": 0.0, "session_wait_le:30.0": 2.0, "session_wait_le:+Inf": 2.0}
    capped = result_of(load, size, 700, {"ahc": rounds_of(384, 2.0, 0, held=wide), "fcfs": rounds_of(96, 4.0, 3)},
                       switch=True)
    assert capped.figures["ahc_wait_p99_ms"] == pytest.approx(capped.figures["ahc_ready_to_token_p99_ms"])
    assert capped.figures["ahc_wait_p99_ms"] == pytest.approx(2100)


def test_the_emulated_sides_report_jct_ttft_tiers_and_the_gain_captured() -> None:
    """Vanilla vLLM, vLLM with offload and the ideal beside AHC: each side's JCT percentiles, first-call
    TTFT, tokens by tier and bytes moved, and the share of the ideal's gain over vLLM each captures."""
    load = AgentLoad(sessions=2, turns=3, rounds=1)
    size = CacheSize(blocks=40, block_size=32, max_model_len=1248, blocks_for_all=83)
    tiers = {"cached_by:device": 700.0, "cached_by:host": 300.0, "load_bytes": 6e8, "store_bytes": 9e8}
    sides = {"ahc": rounds_of(384, 2.0, 0, jct=(10.0, 12.0), counters=tiers),
             "fcfs": rounds_of(96, 4.0, 3, jct=(15.0, 18.0)), "vllm": rounds_of(96, 4.0, 3, jct=(20.0, 24.0)),
             "offload": rounds_of(200, 3.0, 0, jct=(14.0, 18.0)), "ideal": rounds_of(512, 1.0, 0, jct=(8.0, 8.0))}
    result = result_of(load, size, 700, sides, switch=True)
    figures, ratios = result.figures, result.ratios
    assert {f"{side}_jct_mean_s" for side in sides} <= figures.keys()
    assert (figures["ahc_jct_p50_s"], figures["ahc_jct_max_s"], figures["vllm_jct_mean_s"]) == (11.0, 12.0, 22.0)
    assert figures["ahc_ttft_p99_s"] == pytest.approx(0.1)  # each session's first call
    assert (figures["ahc_device_hit_tokens"], figures["ahc_host_hit_tokens"]) == (700, 300)
    assert (figures["ahc_load_bytes"], figures["ahc_store_bytes"], figures["vllm_load_bytes"]) == (6e8, 9e8, 0)
    assert figures["ahc_computed_prompt_tokens"] == 3000 - 4 * 384
    assert ratios["vllm_jct_over_ahc"] == pytest.approx(2.0)
    assert ratios["offload_jct_over_ahc"] == pytest.approx(16 / 11)
    # vLLM 22 s, the ideal 8 s: AHC's 11 s captures 11/14 of the gain, offload's 16 s 6/14.
    assert ratios["ahc_gain_captured"] == pytest.approx(11 / 14)
    assert ratios["offload_gain_captured"] == pytest.approx(6 / 14)
    assert "vanilla vllm serve" in result.notes["sides"] and "ideal" in result.notes["cache"]


def test_the_emulated_load_is_shaped_like_agents() -> None:
    """A shared prefix every session opens with, heavy-tailed tool times and open arrivals."""
    load = AgentLoad(sessions=8, turns=2, calls=40, shared_words=50, tool_min_s=1.0, tool_max_s=3.0,
                     tool_sigma=1.0, arrival_s=40.0, client="messages")
    first = scripts(load, 0)
    shared = first[0].identity.split("You are agent")[0]
    assert len(shared.split()) > 50 and all(s.identity.startswith(shared) for s in first)
    assert not scripts(load, 1)[0].identity.startswith(shared)
    tools = [t for s in first for turn in s.tool_s for t in turn]
    assert min(tools) >= 1.0 and max(tools) > 3 * 3.0  # a tail far past the uniform range
    assert 1.5 < sum(tools) / len(tools) < 2.5  # with the uniform range's mean
    starts = sorted(s.start_s for s in first)
    assert starts[-1] > 10.0 and all(b >= a for a, b in zip(starts, starts[1:]))
    assert first[0].system().startswith(first[0].identity) and "## doc0" in first[0].system()


@pytest.mark.parametrize("spec, error", [("client=x", "unknown client"),
                                         ("offload_gib=8", "needs the emulated engine"),
                                         ("sides=vllm", "must include ahc"), ("sides=ahc+x", "unknown side")])
def test_a_bad_load_is_refused_before_anything_starts(spec: str, error: str) -> None:
    with pytest.raises(ValueError, match=f"BENCH_AGENTS_LOAD: .*{error}"):
        LOADS.parse(spec)


def test_the_bench_is_registered() -> None:
    assert BENCHES["agents"].module == "bench.agents" and BENCHES["agents"].loads() is LOADS


@pytest.mark.slow
@pytest.mark.engine
def test_bench_agents_end_to_end() -> None:
    result = run_bench("agents")
    figures, ratios = result["figures"], result["ratios"]
    assert FIGURES <= figures.keys() and RATIOS <= ratios.keys()
    assert ratios["ahc_hit_over_ceiling"] == pytest.approx(figures["ahc_hit_ratio"] / figures["hit_ratio_ceiling"])
    assert ratios["ahc_tok_over_fcfs"] == pytest.approx(figures["ahc_tok_per_s"] / figures["fcfs_tok_per_s"])
    assert 0 < figures["hit_ratio_ceiling"] <= 1
    assert 0 <= figures["ahc_hit_ratio"] <= figures["hit_ratio_ceiling"] + 1e-9
    assert 0 <= figures["fcfs_hit_ratio"] <= figures["fcfs_hit_ratio_ceiling"] + 1e-9
    # FCFS runs with session-aware admission off: nothing of its is ever held back.
    assert figures["fcfs_held_turns"] == 0 and figures["fcfs_wait_p99_ms"] == 0
    # Sized to overcommit: the sessions' contexts do not all fit at once.
    assert figures["cache_multiple"] > 1.5
