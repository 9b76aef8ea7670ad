"""vLLM's own OpenAI app on the fake engine: chat completions answer through FastAPI's TestClient with
real vLLM request handling (chat template, sampling parameters, response shapes) and no model run."""

from __future__ import annotations

import asyncio
import json
import time
from argparse import Namespace
from functools import partial
from pathlib import Path

import pytest
from chat_bodies import chat as chat_body
from fake_engine import FakeEngine, engine_config, vllm_app, vllm_args
from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def args(tiny_model_dir: Path) -> Namespace:
    return vllm_args(tiny_model_dir)


@pytest.fixture(scope="module")
def config(args: Namespace):
    return engine_config(args)  # seconds, once: reads the model's config and tokenizer


@pytest.fixture
def engine(config) -> FakeEngine:
    return FakeEngine(config)


@pytest.fixture
def app_client(args: Namespace, engine: FakeEngine):
    with TestClient(asyncio.run(vllm_app(args, engine))) as client:
        yield client


# No budget unless a test sets one: a reply runs to the end of the engine's script.
chat = partial(chat_body, question="What do the particles do?", max_tokens=None)


def test_a_chat_completion_is_the_script_decoded(app_client: TestClient, engine: FakeEngine) -> None:
    started = time.monotonic()
    reply = app_client.post("/v1/chat/completions", json=chat())
    assert reply.status_code == 200, reply.text
    body = reply.json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == engine.get_tokenizer().decode(engine.script)
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == len(engine.script)
    # The engine got the chat template's rendering of the conversation, token for token.
    tokenizer = engine.get_tokenizer()
    text = tokenizer.apply_chat_template(chat()["messages"], add_generation_prompt=True, tokenize=False)
    rendered = tokenizer.encode(text, add_special_tokens=False)
    assert engine.requests[-1].prompt_token_ids == rendered
    assert body["usage"]["prompt_tokens"] == len(rendered)
    assert time.monotonic() - started < 5


def test_max_tokens_n_and_logprobs(app_client: TestClient, engine: FakeEngine) -> None:
    body = app_client.post("/v1/chat/completions", json=chat(max_tokens=3, n=2, logprobs=True, top_logprobs=2)).json()
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    first, second = (c["message"]["content"] for c in body["choices"])
    assert first != second  # choice i starts i tokens into the script
    assert body["usage"]["completion_tokens"] == 6
    tokens = body["choices"][0]["logprobs"]["content"]
    assert len(tokens) == 3 and tokens[0]["logprob"] == 0.0 and len(tokens[0]["top_logprobs"]) == 2


def test_streaming_sends_one_delta_per_token_then_usage(app_client: TestClient, engine: FakeEngine) -> None:
    started = time.monotonic()
    request = chat(stream=True, stream_options={"include_usage": True}, max_tokens=100)
    with app_client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert "".join(deltas) == engine.get_tokenizer().decode(engine.script)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == len(engine.script)
    assert time.monotonic() - started < 5


def test_ignore_eos_runs_to_max_tokens(app_client: TestClient) -> None:
    body = app_client.post("/v1/chat/completions", json=chat(max_tokens=40, ignore_eos=True)).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 40


def test_a_dead_engine_answers_500_and_stops_the_server(app_client: TestClient, engine: FakeEngine) -> None:
    engine.dead = True
    reply = app_client.post("/v1/chat/completions", json=chat())
    assert reply.status_code == 500, reply.text
    assert app_client.app.state.server.should_exit  # vLLM's handler asks uvicorn to exit


def collect(engine: FakeEngine, params, prompt=None, request_id: str = "r1") -> list:
    """Every RequestOutput of one generate call, the way vLLM's serving layer iterates it."""
    async def run() -> list:
        return [o async for o in engine.generate(prompt or {"prompt_token_ids": [1, 2, 3]}, params,
                                                 request_id=request_id)]
    return asyncio.run(run())


@pytest.mark.parametrize("kind", ["DELTA", "CUMULATIVE", "FINAL_ONLY"])
def test_output_kinds_add_up_to_the_same_reply(engine: FakeEngine, kind: str) -> None:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(max_tokens=5, n=2, output_kind=RequestOutputKind[kind])
    outputs = collect(engine, params)
    assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    assert len(outputs) == (1 if kind == "FINAL_ONLY" else 5)
    for index in (0, 1):
        steps = [o.outputs[index] for o in outputs]
        ids = [t for s in steps for t in s.token_ids] if kind == "DELTA" else list(steps[-1].token_ids)
        text = "".join(s.text for s in steps) if kind == "DELTA" else steps[-1].text
        assert ids == [engine.script[(index + i) % len(engine.script)] for i in range(5)]
        assert text == engine.get_tokenizer().decode(ids)
        assert steps[-1].finish_reason == "length"
    assert engine.requests[-1].prompt_token_ids == [1, 2, 3]


def test_an_aborted_request_stops_and_is_marked(engine: FakeEngine) -> None:
    from vllm.sampling_params import SamplingParams

    async def run() -> list:
        outputs = []
        async for output in engine.generate({"prompt_token_ids": [1]}, SamplingParams(max_tokens=50), "gone"):
            outputs.append(output)
            await engine.abort("gone")
        return outputs

    assert len(asyncio.run(run())) == 1
    assert engine.requests[-1].aborted


def test_the_kv_cache_size_a_real_engine_would_report(engine: FakeEngine) -> None:
    assert engine.vllm_config.cache_config.num_gpu_blocks == engine.kv_blocks
