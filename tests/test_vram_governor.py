"""The VRAM governor against a real KV shortage: a server whose cache holds 80 blocks (vLLM's own
`--num-gpu-blocks-override`), one long generation holding most of them, and a second request that
cannot fit: it waits, then gets 429 with Retry-After, and vLLM never preempts anything."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.servers import start_server

REPO = Path(__file__).resolve().parents[1]  # the checkout under test

pytestmark = [pytest.mark.slow, pytest.mark.engine]

BLOCKS = 80  # x 32 tokens: 2,560 tokens of KV cache in all


@pytest.fixture(scope="module")
def small_cache_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("vram")
    config = yaml.safe_load((REPO / "configs" / "cpu-tiny.yaml").read_text())
    config["engine"]["extra_args"] = [*config["engine"].get("extra_args", []),
                                      "--num-gpu-blocks-override", str(BLOCKS)]
    config["orchestrator"] = {"vram_queue_timeout_s": 1.5, "retry_after_s": 7}
    path = root / "small-cache.yaml"
    path.write_text(yaml.safe_dump(config))
    server = start_server(root / "xdb", config=path)
    yield server
    server.stop()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`."""
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def test_a_request_that_cannot_fit_waits_then_gets_429_and_vllm_never_preempts(small_cache_server) -> None:
    client = small_cache_server.client()
    model = client.models.list().data[0].id
    started, done, holder = threading.Event(), threading.Event(), {}

    def long_generation() -> None:  # needs ~60 of the 80 blocks for its whole life
        stream = client.chat.completions.create(
            model=model, max_tokens=1900, temperature=0, stream=True, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": "count"}])
        chunks = 0
        for _ in stream:
            chunks += 1
            started.set()
        holder["chunks"] = chunks
        done.set()

    thread = threading.Thread(target=long_generation, daemon=True)
    thread.start()
    assert started.wait(120), "the long generation never started"
    with small_cache_server.http() as http:
        body = {"model": model, "max_tokens": 1000, "messages": [{"role": "user", "content": "me too"}]}
        rejected = http.post("/v1/chat/completions", json=body)
        assert not done.is_set(), "the long generation ended before the second request was judged"
        assert rejected.status_code == 429, rejected.text
        assert rejected.headers["retry-after"] == "7"
        error = rejected.json()["error"]
        assert error["type"] == "rate_limit_error" and "KV cache full" in error["message"]
        thread.join(300)
        assert holder["chunks"] > 1000
        admitted = http.post("/v1/chat/completions", json=body)  # room again once the first is done
        assert admitted.status_code == 200, admitted.text
        assert admitted.json()["context"]["governor"] == []
        metrics = http.get("/metrics").text
    assert metric(metrics, "ahc_governor_actions_total", action="vram_queue") >= 1
    assert metric(metrics, "ahc_governor_actions_total", action="vram_reject") >= 1
    assert "vllm:num_preemptions_total" in metrics, "vLLM's preemption counter is missing"
    assert metric(metrics, "vllm:num_preemptions_total") == 0
