"""`ahc bench serve`: AHC's server against vLLM's own OpenAI api_server, same model, same engine flags,
same load, in one run.

vLLM runs `python -m vllm.entrypoints.openai.api_server` with the very flags `ahc serve` gives its
engine (server/engine_args.py over configs/cpu-tiny.yaml); AHC runs as a user runs it: every token,
input and reply recorded into XDB, concept activations captured in the engine (a lens pack built for
the bench model). The load: BATCH concurrent clients, each sending streaming chat requests of
MAX_TOKENS tokens (`ignore_eos`, so every reply has the same length) with a short distinct prompt.
Both servers are up together and measured in alternating rounds, so the machine's drift falls on both
alike; the figure is completion tokens per second of wall time over a round, median of ROUNDS.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

from ahc.config import REPO_ROOT, load_config
from ahc.server_process import ServerProcess, ensure_model, free_port, launch, start_server
from bench.activations import ensure_pack, has_activations
from bench.orchestrator import MODEL_FLAGS
from bench.result import BenchResult
from bench.rounds import alternating_rounds

BATCH = 8
MAX_TOKENS = 128
REQUESTS_PER_CLIENT = 2
ROUNDS = 6
MAX_MODEL_LEN = 2048


def start_vllm(model_dir: Path, log_dir: Path) -> ServerProcess:
    """vLLM's own OpenAI server with the engine flags `ahc serve` would use for this model."""
    from server.engine_args import vllm_cli_args

    port = free_port()
    config = load_config(REPO_ROOT / "configs" / "cpu-tiny.yaml").with_overrides(
        model=str(model_dir), port=port, **{"engine.max_model_len": MAX_MODEL_LEN})
    env = {"VLLM_CPU_KVCACHE_SPACE": str(config.engine.cpu_kvcache_space_gib)}
    return launch([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *vllm_cli_args(config)], port,
                  log_dir / "vllm.log", env=env, timeout=600)


def one_client(client: openai.OpenAI, model: str, seed: int) -> int:
    tokens = 0
    for i in range(REQUESTS_PER_CLIENT):
        stream = client.chat.completions.create(
            model=model, max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": f"Client {seed}, request {i}: what do the particles do?"}])
        for chunk in stream:
            if chunk.usage is not None:
                tokens += chunk.usage.completion_tokens
    return tokens


def load_round(client: openai.OpenAI, model: str) -> float:
    """Completion tokens per second of wall time, BATCH clients at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(BATCH) as pool:
        tokens = sum(pool.map(lambda seed: one_client(client, model, seed), range(BATCH)))
    elapsed = time.perf_counter() - started
    if tokens != BATCH * REQUESTS_PER_CLIENT * MAX_TOKENS:
        raise RuntimeError(
            f"serve bench: {tokens} completion tokens, expected {BATCH * REQUESTS_PER_CLIENT * MAX_TOKENS}")
    return tokens / elapsed


def run() -> BenchResult:
    model_dir = ensure_model(REPO_ROOT / ".cache" / "models" / "bench-6x512", *MODEL_FLAGS)
    pack = ensure_pack(model_dir, REPO_ROOT / ".cache" / "lenses" / "bench-6x512")
    with tempfile.TemporaryDirectory() as tmp:
        servers: list[ServerProcess] = []
        try:
            servers.append(start_vllm(model_dir, Path(tmp) / "vllm"))
            servers.append(start_server(Path(tmp) / "ahc", model=model_dir, lens=str(pack),
                                        extra=["--max-model-len", str(MAX_MODEL_LEN)]))
            clients = [s.client(timeout=600) for s in servers]
            model = clients[0].models.list().data[0].id
            rounds = alternating_rounds([lambda c=c: load_round(c, model) for c in clients], ROUNDS)
            recorded = has_activations(servers[1].base_url)
        finally:
            for server in servers:
                server.stop()
    if not recorded:
        raise RuntimeError("serve bench: AHC recorded no tokens with activations; the comparison would be unfair")
    vllm_rate, ahc_rate = statistics.median(rounds[0]), statistics.median(rounds[1])
    figures = {"ahc_tok_per_s": ahc_rate, "vllm_tok_per_s": vllm_rate, "batch": BATCH,
               "max_tokens": MAX_TOKENS, "rounds": ROUNDS}
    return BenchResult("serve", figures, {"ahc_over_vllm": ahc_rate / vllm_rate},
                       {"model": "random Llama 6x512 (ahc tiny-model), float32", "device": "cpu",
                        "ahc": "every token recorded in XDB with top-10 concept activations (lens at layer 3)",
                        "vllm": "python -m vllm.entrypoints.openai.api_server, same engine flags",
                        "rounds_vllm": ", ".join(f"{r:.1f}" for r in rounds[0]),
                        "rounds_ahc": ", ".join(f"{r:.1f}" for r in rounds[1])})
