"""`ahc bench serve`'s figures and its load client: percentiles and CPU per token computed right, the
client against a scripted SSE server, the options on the command line, and one short real load on the
session's server (its recording checked as the bench checks AHC's)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import cli_runner
import numpy as np
import pytest
from aiohttp import web

from bench.result import BenchResult
from bench.serve import Side, plot_scaling, side_figures
from bench.serve_profiles import PROFILES
from bench.stream_load import (
    Load,
    Round,
    Target,
    TimedReply,
    latency_ms,
    measure,
    parse_event,
    percentile,
    process_cpu_s,
)
from server.cluster.server_process import ServerProcess


def ahc(*args: str) -> subprocess.CompletedProcess:
    # In this process (cli_runner): the same exit codes and output; tests/test_cli.py runs the real process.
    return cli_runner.ahc(*args)


@pytest.mark.parametrize("q", [0, 1, 37.5, 50, 90, 99, 100])
def test_percentile_matches_numpy(q: float) -> None:
    values = list(np.random.default_rng(3).exponential(size=57))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert math.isnan(percentile([], q))


def test_latency_from_chunk_times() -> None:
    # Two replies sent at t=0: first content at 0.1 and 0.3 s, then chunks 10 ms and 30 ms apart.
    # The streams end 20 ms and 60 ms after their last tokens.
    replies = [TimedReply(sent=0.0, chunk_times=[0.1, 0.11, 0.12, 0.13], completion_tokens=4, ended=0.15),
               TimedReply(sent=0.0, chunk_times=[0.3, 0.33], completion_tokens=2, ended=0.39)]
    figures = latency_ms([Round(replies, wall_s=1.0, client_cpu_s=0.0, api_cpu_s=None)])
    assert figures["ttft_p50_ms"] == pytest.approx(200)
    assert figures["ttft_p99_ms"] == pytest.approx(100 + 200 * 0.99)
    assert figures["itl_p50_ms"] == pytest.approx(10)
    assert figures["itl_p99_ms"] == pytest.approx(10 + 20 * 0.97)  # gaps 10, 10, 10, 30 ms
    assert figures["end_wait_p50_ms"] == pytest.approx(40)
    assert figures["end_wait_p99_ms"] == pytest.approx(20 + 40 * 0.99)


def test_cpu_per_token_and_the_medians_across_rounds() -> None:
    def rnd(tokens: int, wall: float, cpu: float | None) -> Round:
        return Round([TimedReply(0.0, [0.1, 0.2], tokens)], wall_s=wall, client_cpu_s=0.001, api_cpu_s=cpu)

    rounds = [rnd(1000, 1.0, 0.05), rnd(1000, 2.0, 0.2), rnd(1000, 4.0, 0.1)]
    assert rounds[0].cpu_us_per_token == pytest.approx(50)
    figures = side_figures(Side("ahc_", Target("http://x", "m")), rounds)
    assert figures["ahc_tok_per_s"] == pytest.approx(500)  # 1000, 500, 250 tok/s
    assert figures["ahc_cpu_us_per_token"] == pytest.approx(100)  # 50, 200, 100 µs
    assert figures["ahc_tokens_per_chunk"] == pytest.approx(500)
    assert figures["ahc_cpu_us_per_request"] == pytest.approx(100_000)  # one reply a round: 50, 200, 100 ms
    assert figures["ahc_api_cores"] == pytest.approx(0.05) and figures["ahc_client_cores"] == pytest.approx(0.001 / 2)
    # Without the API process's pid there is no CPU figure at all (not a zero).
    assert "cpu_us_per_token" not in side_figures(Side("", Target("http://x", "m")), [rnd(10, 1.0, None)])


@pytest.mark.process
def test_process_cpu_leaves_out_child_processes() -> None:
    # vLLM's EngineCore is a child of the API process: its CPU must not count as the API process's.
    before = process_cpu_s(os.getpid())
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 1.0\n"
                    "while time.process_time() < end: pass"], check=True)
    assert process_cpu_s(os.getpid()) - before < 0.5


def test_parse_event_takes_content_usage_and_session() -> None:
    reply = TimedReply(sent=0.0)
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "context": {"session_id": "s-1", "blocks": []}}
    for i, line in enumerate([b"data: " + json.dumps(role).encode() + b"\n", b"\n",
                              b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n',
                              b'data: {"choices": [{"index": 0, "delta": {"content": ""}}]}\n',
                              b'data: {"choices": [{"index": 0, "delta": {"content": "b"}}]}\n',
                              b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n',
                              b"data: [DONE]\n"]):
        parse_event(line, reply, float(i))
    assert reply.chunk_times == [2.0, 4.0]
    assert reply.completion_tokens == 3 and reply.session_id == "s-1"


@pytest.fixture
def sse_server() -> Iterator[str]:
    """A chat endpoint streaming `max_tokens` one-token chunks 1 ms apart (one short for 13), then the
    usage chunk."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = body["max_tokens"] - (body["max_tokens"] == 13)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(tokens):
            await asyncio.sleep(0.001)
            await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n')
        usage = {"choices": [], "usage": {"completion_tokens": tokens}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_load_client_counts_every_token_and_chunk(sse_server: str) -> None:
    result = measure(Target(sse_server, "m", pid=os.getpid()), Load(clients=4, requests=2, max_tokens=20))
    assert len(result.replies) == 8 and result.tokens == 160 and result.chunks == 160
    assert all(r.ttft > 0 and len(r.gaps()) == 19 and r.session_id is None for r in result.replies)
    assert result.api_cpu_s is not None and result.cpu_us_per_token is not None and result.client_cpu_s > 0
    assert result.tok_per_s > 0


def test_load_client_rejects_short_replies(sse_server: str) -> None:
    # The scripted server answers max_tokens 13 with 12 tokens: a round short of tokens is an error.
    with pytest.raises(RuntimeError, match="12 completion tokens, expected 13"):
        measure(Target(sse_server, "m"), Load(clients=1, requests=1, max_tokens=13))


def test_help_lists_the_profiles() -> None:
    result = ahc("bench", "serve", "--help")
    assert result.returncode == 0
    for name in PROFILES:
        assert name in result.stdout
    for flag in ("--base-url", "--pid", "--scaling", "--plot", "--api-server-count"):
        assert flag in result.stdout


def test_serve_options_are_bad_usage_elsewhere() -> None:
    assert ahc("bench", "xdb", "--scaling").returncode == 2
    assert ahc("bench", "serve", "--pid", "1").returncode == 2  # only with --base-url
    assert ahc("bench", "serve", "--profile", "warp").returncode == 2
    assert ahc("bench", "xdb", "--api-server-count", "2").returncode == 2
    assert ahc("bench", "serve", "--base-url", "http://127.0.0.1:9", "--api-server-count", "2").returncode == 2


def test_plot_draws_the_scaling_figures(tmp_path: Path) -> None:
    figures = {f"{side}_{name}_at_{n}": float(n) for side in ("ahc", "vllm") for n in (1, 8)
               for name in ("tok_per_s", "cpu_us_per_token")}
    out = plot_scaling(BenchResult("serve-scaling", figures, {}, {"streams": "1,8", "profile": "gpu-rate"}),
                       tmp_path / "s.png")
    assert out.read_bytes().startswith(b"\x89PNG")


@pytest.mark.engine
def test_short_load_on_the_real_server_is_recorded(server: ServerProcess, model_name: str) -> None:
    """The gpu-rate load's shape, short, on the session's `ahc serve`: figures for it, and every
    completion token an `output` row of its reply's session (as the bench checks AHC after each round)."""
    side = Side("", Target(server.base_url, model_name, server.api_key, server.process.pid))
    result = side.measure(Load(clients=32, requests=1, max_tokens=32))
    assert result.tokens == 32 * 32 and side.recorded_rows == result.tokens
    figures = side_figures(side, [result])
    assert figures["tok_per_s"] > 0 and figures["cpu_us_per_token"] > 0
    # The engine core's CPU apart from the API process's, and how many cores each kept busy.
    assert figures["engine_cpu_us_per_token"] > 0 and figures["engine_cores"] > 0
    assert figures["cpu_us_per_request"] == pytest.approx(figures["cpu_us_per_token"] * 32, rel=1e-6)
    assert 0 < figures["ttft_p50_ms"] <= figures["ttft_p99_ms"] and 0 < figures["itl_p50_ms"] <= figures["itl_p99_ms"]
