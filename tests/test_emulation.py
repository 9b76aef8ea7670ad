"""The emulated GPU engine: its cost model is its formula and meets published vLLM figures; its
executor samples where vLLM's model runner would; vLLM's own prefix caching and LRU eviction run on it
exactly as on the real engine; and everything it serves says it is emulated."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import forked
import numpy as np
import pytest
from bench_smoke import check_result

from bench.servers import start_server
from core.config import load_config
from server.cluster.server_process import AHC
from server.emulation.calibration import POINTS, table
from server.emulation.engine_flags import emulation_flags, gpu_batch_defaults
from server.emulation.executor import MIN_REPLY_TOKENS, TAG_EVERY, EmulatedExecutor, _EmulatedLens, reply_length
from server.emulation.profiles import H100_SXM, LLAMA_31_8B, profile
from server.emulation.roofline import GPU, SequenceStep

SEQUENCE_SCRIPT = Path(__file__).parent / "emulation_sequence.py"


def test_a_decode_step_is_bandwidth_bound_and_a_long_prefill_compute_bound() -> None:
    r = profile("h100-llama-8b")
    kv = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    assert LLAMA_31_8B.kv_bytes_per_token == kv == 131072
    # One sequence of 1,000 tokens decoding one: every weight and its KV read, one token's KV written.
    decode = (LLAMA_31_8B.params * 2 + 1001 * kv + kv) / (H100_SXM.bandwidth * r.bandwidth_efficiency)
    assert r.step_seconds([SequenceStep(1, 1000, True)]) == pytest.approx(decode + r.step_overhead_s, rel=1e-9)
    # 8,192 new tokens: two FLOPs a weight a token (LM head for the one sampled) plus causal attention.
    matmul = LLAMA_31_8B.params - 2 * 128256 * 4096
    attention = 4 * 32 * 32 * 128 * 8192 * (8192 + 1) / 2
    flops = 2 * matmul * 8192 + 2 * 128256 * 4096 + attention
    prefill = flops / (H100_SXM.bf16_flops * r.flops_efficiency)
    assert r.step_seconds([SequenceStep(8192, 0, True)]) == pytest.approx(prefill + r.step_overhead_s, rel=1e-9)
    assert r.step_seconds([]) == 0.0


def test_the_kv_cache_is_what_the_gpu_holds_after_the_weights() -> None:
    r = profile("h100-llama-8b")
    expected = int(80 * 1024**3 * 0.9) - LLAMA_31_8B.params * 2 - 4 * 1024**3
    assert r.kv_cache_bytes() == expected
    assert 400_000 < r.kv_tokens() < 450_000  # what vLLM reports for this pair at 0.9 utilization


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p.key}-{p.unit}")
def test_the_cost_model_meets_published_vllm_measurements(point) -> None:  # type: ignore[no-untyped-def]
    emulated = dict((p.setting, got) for p, got in table())[point.setting]
    assert 0.85 <= emulated / point.published <= 1.15, (point.setting, emulated, point.published)


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown emulation profile 'h200-llama-70b'; known: h100-llama-8b"):
        emulation_flags("h200-llama-70b")


def test_the_emulated_engine_schedules_with_the_gpus_defaults_unless_the_config_sets_them() -> None:
    """vLLM's own defaults for its server on that GPU, not its CPU build's (2,048 tokens, 128 sequences)."""
    flags = emulation_flags("h100-llama-8b")
    assert flags[flags.index("--max-num-seqs") + 1] == "1024"
    assert flags[flags.index("--max-num-batched-tokens") + 1] == "8192"
    own = emulation_flags("h100-llama-8b", max_num_seqs=16, max_num_batched_tokens=4096)
    assert (own[own.index("--max-num-seqs") + 1], own[own.index("--max-num-batched-tokens") + 1]) == ("16", "4096")
    gib = 1 << 30
    sized = {name: gpu_batch_defaults(GPU(name, memory * gib, 1e12, 1e14, 1e10))
             for name, memory in (("H200", 141), ("B200", 180), ("A100 80GB", 80), ("RTX 4090", 24))}
    assert sized == {"H200": (8192, 1024), "B200": (16384, 1024), "A100 80GB": (2048, 256), "RTX 4090": (2048, 256)}


def executor() -> EmulatedExecutor:
    """The executor's step alone (a unit test of one piece): no engine around it."""
    ex = object.__new__(EmulatedExecutor)
    ex.roofline = profile("h100-llama-8b")
    ex.token_ids, ex.eos, ex.reply_tokens = list(range(10, 60)), 2, None
    ex.sequences, ex.modelled_s, ex.lens = {}, 0.0, None
    return ex


def scheduled(new: list[tuple[str, int, int]], cached: list[tuple[str, int]], tokens: dict[str, int],
              finished: set[str] = frozenset()) -> SimpleNamespace:  # type: ignore[assignment]
    return SimpleNamespace(
        finished_req_ids=finished,
        scheduled_new_reqs=[SimpleNamespace(req_id=r, prompt_token_ids=[1] * n, num_computed_tokens=c)
                            for r, n, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached],
                                              num_computed_tokens=[c for _, c in cached]),
        num_scheduled_tokens=tokens, kv_connector_metadata=None)


def test_a_step_samples_where_a_sequence_reaches_its_end_and_lasts_the_modelled_time() -> None:
    ex = executor()
    # "a" (100 tokens, 64 cached) prefills to its end; "b" (300) gets its first chunk of 200.
    first = ex.step(scheduled([("a", 100, 64), ("b", 300, 0)], [], {"a": 36, "b": 200}))
    assert first.req_ids == ["a", "b"] and len(first.sampled_token_ids[0]) == 1 and first.sampled_token_ids[1] == []
    steps = [SequenceStep(36, 64, True), SequenceStep(200, 0, False)]
    assert ex.modelled_s == pytest.approx(ex.roofline.step_seconds(steps))
    # Next step: "a" decodes one, "b" finishes its prompt; both sample, deterministically.
    second = ex.step(scheduled([], [("a", 100), ("b", 200)], {"a": 1, "b": 100}))
    assert [len(t) for t in second.sampled_token_ids] == [1, 1]
    again = executor()
    again.step(scheduled([("a", 100, 64), ("b", 300, 0)], [], {"a": 36, "b": 200}))
    assert again.step(scheduled([], [("a", 100), ("b", 200)], {"a": 1, "b": 100})).sampled_token_ids == \
        second.sampled_token_ids
    assert all(t in ex.token_ids for ts in second.sampled_token_ids for t in ts)
    ex.step(scheduled([], [], {}, finished={"a", "b"}))
    assert ex.sequences == {}


class Shipped:
    """Stands in for the capture's sender: what the emulated lens would put on the side channel."""

    def __init__(self) -> None:
        self.steps: list[tuple[list[str], list[int], np.ndarray, np.ndarray, str]] = []

    def add(self, keys: list[str], positions: list[int], rows: np.ndarray, index: Any, values: Any,
            source: str) -> None:
        self.steps.append((keys, positions, index.numpy()[rows], values.numpy()[rows], source))


def test_with_a_reply_length_each_reply_ends_with_eos_at_its_drawn_length() -> None:
    """Agent clients finish their turns on the emulated engine: each reply ends (EOS) at a length drawn
    by its request around the mean, the same length every time, never without text (clients ask again on
    an empty reply); without one, replies never end."""
    lengths = [reply_length(zlib.crc32(f"req-{i}".encode()), 20) for i in range(400)]
    assert min(lengths) == MIN_REPLY_TOKENS and 15 < sum(lengths) / len(lengths) < 25 and len(set(lengths)) > 20
    ex = executor()
    ex.reply_tokens = 20
    request = "req-7"
    expected = reply_length(zlib.crc32(request.encode()), 20)
    tokens = [ex.step(scheduled([(request, 10, 0)], [], {request: 10})).sampled_token_ids[0][0]]
    while tokens[-1] != ex.eos:
        tokens.append(ex.step(scheduled([], [(request, 10 + len(tokens))], {request: 1})).sampled_token_ids[0][0])
    assert len(tokens) == expected and ex.eos not in tokens[:-1]
    endless = executor()
    first = endless.step(scheduled([(request, 10, 0)], [], {request: 10})).sampled_token_ids[0]
    drawn = [endless.step(scheduled([], [(request, 11 + i)], {request: 1})).sampled_token_ids[0][0] for i in range(60)]
    assert endless.eos not in first + drawn


def test_reply_tokens_need_an_emulated_engine() -> None:
    with pytest.raises(ValueError, match="needs engine.emulate"):
        load_config("cpu-tiny").with_overrides(**{"engine.emulate_reply_tokens": 10})
    assert json.loads(emulation_flags("h100-llama-8b", None, 12)[3])["ahc_emulate_reply_tokens"] == 12


def test_the_emulated_lens_ships_each_sampled_token_k_distinct_concepts() -> None:
    ex = executor()
    ex.lens = object.__new__(_EmulatedLens)
    ex.lens.n_concepts, ex.lens.k, ex.lens.sender = 12, 10, Shipped()
    ex.lens.thresholds = np.full(12, 0.5, dtype=np.float32)
    ex.lens.falling = np.linspace(0.9, 0.5, 10, dtype=np.float32)
    ex.step(scheduled([("a-0123abcd", 100, 64), ("b-0123abcd", 300, 0)], [], {"a-0123abcd": 36, "b-0123abcd": 200}))
    ex.step(scheduled([], [("a-0123abcd", 100)], {"a-0123abcd": 1}))
    first, second = ex.lens.sender.steps
    # Only "a" reached its end in the first step: its reply's token 0, then token 1; keys as the worker's.
    assert (first[0], first[1], second[1]) == (["a"], [0], [1])
    keys, _, index, values, source = first
    assert source == "emulated" and index.shape == values.shape == (1, 10)
    assert len(set(index[0])) == 10 and all(0 <= i < 12 for i in index[0])
    assert list(values[0]) == sorted(values[0], reverse=True) and values[0][1] < 0.5
    assert not np.array_equal(index, second[2])  # each token its own draw


def test_the_emulated_lens_fires_a_concept_tag_now_and_then() -> None:
    lens = object.__new__(_EmulatedLens)
    lens.n_concepts, lens.k, lens.sender = 6, 6, Shipped()
    lens.thresholds = np.array([0.5, 0.4, 0.5, 0.6, 0.5, 0.5], dtype=np.float32)
    lens.falling = np.linspace(0.9, 0.5, 6, dtype=np.float32)
    lens.ship([(f"r{i}", i, 0) for i in range(200)])
    _, _, index, values, _ = lens.sender.steps[0]
    reached = values >= lens.thresholds[index]
    assert not reached[:, 1:].any()  # only a top concept ever reaches its threshold
    assert reached[:, 0].sum() == 200 // TAG_EVERY


def sequence(kind: str, model: Path, offload_gib: float | None = None) -> dict[str, list[Any]]:
    """Each request's cached tokens (`cached`) and what vLLM's KV events said its session held before it
    (`held`: GPU and CPU-tier blocks), as tests/emulation_sequence.py prints them."""
    offload = [str(offload_gib)] if offload_gib is not None else []
    done = forked.run([sys.executable, str(SEQUENCE_SCRIPT), kind, str(model), *offload], 600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def emulated_sequence(tiny_model_dir: Path) -> dict[str, list[Any]]:
    """The cached tokens of each prompt of the sequence on the emulated engine (one engine, in a subprocess)."""
    return sequence("emulated", tiny_model_dir)


@pytest.mark.slow
@pytest.mark.engine
def test_prefix_caching_and_lru_eviction_run_on_the_emulated_engine(emulated_sequence: dict[str, list[Any]]) -> None:
    """vLLM's own KV cache manager, 32 blocks of 32 tokens: a repeated 320-token prompt reads its full
    blocks but the one holding its last token; three other prompts later it has been evicted, least
    recently used first, while the latest one is still whole. Its KV events, read per session, say
    before each prompt what the lookup then finds."""
    cached = emulated_sequence["cached"]  # A A B A C D E A E
    assert cached[:7] == [0, 288, 0, 288, 0, 0, 0]
    assert cached[7] < 288 and cached[8] == 288
    assert_events_foretell_hits(emulated_sequence)


def assert_events_foretell_hits(run: dict[str, list[Any]]) -> None:
    """Without a CPU tier, the blocks the events say a session holds on the GPU are what its next prompt
    hits (all but the block with its last token, which vLLM recomputes)."""
    assert [min(gpu, 9) * 32 for gpu, _ in run["held"]] == run["cached"]
    assert all(cpu == 0 for _, cpu in run["held"])


@pytest.mark.slow
@pytest.mark.engine
def test_the_emulated_engine_caches_and_evicts_as_the_real_engine_does(emulated_sequence: list[int],
                                                                        tiny_model_dir: Path) -> None:
    """The same sequence on vLLM's real (CPU) engine with the same blocks: the same cached tokens, each."""
    real = sequence("real", tiny_model_dir)
    assert emulated_sequence == real
    assert_events_foretell_hits(real)


@pytest.mark.slow
@pytest.mark.engine
def test_a_prefix_evicted_from_the_gpu_comes_back_from_the_cpu_tier(emulated_sequence: dict[str, list[Any]],
                                                                     tiny_model_dir: Path) -> None:
    """vLLM's native CPU offloading on the emulated engine, its tier (0.3 GiB: 76 blocks of 4 MiB) room for
    every prompt: A, evicted from the GPU by C, D and E, is read whole from host memory where the GPU
    alone had kept one block of it; prompts never seen before still hit nothing. The tier's KV events say
    so first: one block of A on the GPU, all ten in the tier."""
    offloaded = sequence("emulated", tiny_model_dir, 0.3)  # A A B A C D E A E
    assert emulated_sequence["cached"][7] < 288
    # The connector loads a prompt's last block too, which the GPU's own cache leaves to be recomputed.
    assert offloaded["cached"] == [0, 320, 0, 320, 0, 0, 0, 320, 320]
    assert offloaded["held"][7] == [1, 10]
    assert [cpu for _, cpu in offloaded["held"]] == [0, 10, 0, 10, 0, 0, 0, 10, 10]


@pytest.mark.slow
@pytest.mark.engine
def test_ahc_serve_on_the_emulated_engine_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path / "xdb", model=tiny_model_dir, lens="off",
                          extra=["--emulate", "h100-llama-8b", "--max-model-len", "4096"])
    try:
        client = server.client()
        card = client.models.list().data[0]
        assert card.model_extra["emulated"]["gpu"] == "NVIDIA H100 SXM5 80GB"
        assert card.model_extra["emulated"]["model"] == "Llama-3.1-8B-Instruct"
        raw = client.chat.completions.with_raw_response.create(
            model=card.id, max_tokens=12, messages=[{"role": "user", "content": "hello"}],
            extra_body={"context": {"session_id": "emulated-1"}})
        assert raw.headers["x-ahc-engine"] == "emulated:h100-llama-8b"  # on every response
        assert raw.parse().usage.completion_tokens == 12
        assert "EMULATED engine: Llama-3.1-8B-Instruct on NVIDIA H100 SXM5 80GB" in server.log_tail(200_000)
        with server.http() as http:
            assert 'ahc_engine_emulated{model_name=' in http.get("/metrics").text
            assert "EMULATED h100-llama-8b" in http.get("/ui/").text
            assert http.get("/health").headers["x-ahc-engine"] == "emulated:h100-llama-8b"
            deadline = time.monotonic() + 5  # the turn's record is committed within a second of the reply
            while not (turns := http.get("/v1/xdb/sessions/emulated-1/turns").json()["turns"]):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert [t["engine"] for t in turns] == ["emulated:h100-llama-8b"]
            manifest = http.post("/v1/xdb/exports", json={}).json()
            assert manifest["engines"] == ["emulated:h100-llama-8b"]
    finally:
        server.stop()


def test_an_emulated_engine_ships_into_a_shared_lake_only_when_asked() -> None:
    lake = {"xdb.backend": "ducklake", "xdb.lake.catalog": "dbname=x", "xdb.lake.data_path": "/tmp/lake",
            "xdb.lake.replica_id": "r0", "engine.emulate": "h100-llama-8b"}
    with pytest.raises(ValueError, match="accept_emulated"):
        load_config("cpu-tiny").with_overrides(**lake)
    assert load_config("cpu-tiny").with_overrides(**lake, **{"xdb.lake.accept_emulated": True}).engine_label == \
        "emulated:h100-llama-8b"


@pytest.mark.slow
@pytest.mark.engine
def test_the_serving_bench_runs_both_servers_on_the_emulated_engine() -> None:
    """`ahc bench serve --engine emulated` at a small load: vLLM's own server and AHC, each on its emulated
    engine, every AHC token recorded, and the result says the device is emulated."""
    env = {"BENCH_SERVE_LOAD": "clients=4,requests=1,max_tokens=16,rounds=1"}
    done = forked.run([AHC, "bench", "serve", "--engine", "emulated", "--json"], 900, env)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    check_result("serve", result)
    assert result["figures"]["batch"] == 4 and result["notes"]["profile"] == "h100-llama-8b"
    assert result["notes"]["device"].startswith("EMULATED h100-llama-8b")
    # 4 replies x 16 tokens, the warm-up round too: each with the activations the emulated engine drew.
    assert result["notes"]["xdb_ahc"] == ("every round checked: 128 output rows for as many completion tokens, "
                                          "128 with concept activations")


@pytest.mark.process
def test_the_emulated_engine_is_bad_usage_outside_serve_and_with_a_real_profile() -> None:
    for args, message in ((["bench", "xdb", "--engine", "emulated"], "No such option: --engine"),
                          (["bench", "serve", "--engine", "emulated", "--profile", "6x512"],
                           "chooses the load 'h100-llama-8b'")):
        done = subprocess.run([AHC, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and message in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.engine
def test_the_agents_bench_runs_coding_agents_on_the_emulated_engine() -> None:
    """`ahc bench agents --engine emulated` at a small load: sessions of several model calls a turn with
    tool time between them, each sending its whole history, on seven servers each on its emulated H100:
    AHC, its two ablations and FCFS with a CPU tier, vanilla vLLM, vLLM with the same tier, and the ideal
    cache."""
    env = {"BENCH_AGENTS_LOAD": "sessions=3,turns=2,calls=3,max_tokens=16,tool_words=40,"
                                              "tool_min_s=0.1,tool_max_s=0.2,think_min_s=0.1,think_max_s=0.2,"
                                              "identity_words=200,codex_words=100,shared_words=100,"
                                              "arrival_s=1,rounds=1,warmup=false,offload_gib=1"}
    done = forked.run([AHC, "bench", "agents", "--engine", "emulated", "--json"], 900, env)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    check_result("agents", result)
    figures = result["figures"]
    assert figures["sessions"] == 3 and figures["block_size"] == 16
    assert result["notes"]["device"].startswith("EMULATED h100-llama-8b")
    assert "--max-num-seqs 1024" in result["notes"]["scheduler"]
    # Each call after a session's first could read most of its prompt from the cache.
    assert figures["hit_ratio_ceiling"] > 0.5 and figures["ahc_jct_mean_s"] > 0
    # The contexts overflow the GPU: what vanilla vLLM recomputes, the CPU tier serves by a copy.
    assert figures["vllm_host_hit_tokens"] == 0 and figures["vllm_load_bytes"] == 0
    for side in ("ahc", "offload"):
        assert figures[f"{side}_host_hit_tokens"] > 0 and figures[f"{side}_load_bytes"] > 0
        assert figures[f"{side}_computed_prompt_tokens"] < figures["vllm_computed_prompt_tokens"]
    assert figures["ideal_host_hit_tokens"] == 0 and figures["ideal_hit_ratio"] > figures["vllm_hit_ratio"]
    # The ablations ran beside it: program order alone, and the GPU's return order as well.
    for side in ("ahc_priority", "ahc_gpu"):
        assert figures[f"{side}_jct_mean_s"] > 0 and figures[f"{side}_host_hit_tokens"] > 0
