"""`/v1/completions` on the fake engine's app: its prompts and tokens recorded in one session, its KV
blocks reserved (429 when the cache cannot hold it), bad bodies named, streams released."""

from __future__ import annotations

import json

import pytest
from fake_app import health_while_posting
from fastapi.testclient import TestClient

from server.runtime import Runtime
from xdb.owner import EVERY

BLOCKS = 1000


@pytest.fixture(autouse=True)
def kv_cache(served: tuple[TestClient, Runtime]) -> None:
    served[1].metrics.kv_stats.total_blocks = BLOCKS  # the fake engine reports no cache of its own


def sessions_of(runtime: Runtime, marker: str) -> set[str]:
    runtime.xdb.writer.flush()
    return {r["session_id"] for r in runtime.xdb.recall({"text": marker, "event_types": "input"}, owner=EVERY)}


def test_a_batch_of_prompts_is_recorded_in_one_session_with_its_tokens(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    reply = client.post("/v1/completions", json={"model": "tiny", "max_tokens": 5,
                                                  "prompt": ["first prompt zeta", "second prompt zeta"]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert len(body["choices"]) == 2 and "context" not in body
    [session] = sessions_of(runtime, "prompt zeta")
    rows = runtime.xdb.recall({"session_id": session, "limit": 1000}, owner=EVERY)
    inputs = [r for r in rows if r["event_type"] == "input"]
    assert [r["content"] for r in inputs] == ["first prompt zeta", "second prompt zeta"]
    assert [r["metadata"]["prompt_index"] for r in inputs] == [0, 1]
    outputs = [r for r in rows if r["event_type"] == "output"]
    assert len(outputs) == body["usage"]["completion_tokens"]
    assert runtime.governor.free_blocks() == BLOCKS  # released


def test_a_completion_the_kv_cache_cannot_hold_is_429(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    runtime.metrics.kv_stats.total_blocks, runtime.metrics.kv_stats.block_size = 4, 16  # 64 tokens in all
    response = client.post("/v1/completions", json={"model": "tiny", "max_tokens": 500, "prompt": "too much eta"})
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "kv_cache_full"
    assert response.headers["retry-after"] == str(runtime.config.orchestrator.retry_after_s)
    assert sessions_of(runtime, "too much eta") == set()  # nothing recorded for a refused request
    assert runtime.governor.free_blocks() == 4


@pytest.mark.parametrize("body, param", [({"model": "tiny", "max_tokens": 4}, "prompt"),
                                         ({"model": "tiny", "prompt": "x", "max_tokens": "many"}, "max_tokens")])
def test_a_bad_body_is_400_naming_the_field(served: tuple[TestClient, Runtime], body: dict, param: str) -> None:
    client, _ = served
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert param in (response.json()["error"]["param"] or "") + response.json()["error"]["message"]


def test_a_streamed_completion_is_recorded_and_released(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    with client.stream("POST", "/v1/completions", json={"model": "tiny", "max_tokens": 6, "stream": True,
                                                        "prompt": [11, 12, 13, 14]}) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
    runtime.xdb.writer.flush()
    inputs = [r for r in runtime.xdb.recall({"event_types": "input", "limit": 1000}, owner=EVERY)
              if (r["metadata"] or {}).get("endpoint") == "completions"]
    [row] = inputs
    assert row["metadata"]["prompt_token_ids"] == 4
    outputs = runtime.xdb.recall({"session_id": row["session_id"], "event_types": "output"}, owner=EVERY)
    assert "".join(r["content"] for r in outputs) == text
    assert runtime.governor.free_blocks() == BLOCKS


@pytest.mark.parametrize("prompt", [[[5, 6, 7], list(range(3000))], ["fine", "w " * 5000]], ids=["token-ids", "text"])
def test_a_prompt_over_the_window_is_400_before_it_is_decoded_or_recorded(served: tuple[TestClient, Runtime],
                                                                          prompt: object,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    client, runtime = served
    decoded: list[object] = []
    monkeypatch.setattr(runtime.tokenizer, "decode", lambda *a, **k: decoded.append(a) or "")
    before = len(runtime.hidden.engine.requests)  # type: ignore[attr-defined]
    response = client.post("/v1/completions", json={"model": "tiny", "max_tokens": 4, "prompt": prompt})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "prompt 1 is" in error["message"] and "2,048-token window" in error["message"]
    assert decoded == [] and len(runtime.hidden.engine.requests) == before  # type: ignore[attr-defined]
    assert runtime.governor.free_blocks() == BLOCKS


@pytest.mark.slow
@pytest.mark.alone
def test_health_stays_fast_while_a_20_mb_completion_prompt_is_measured(served: tuple[TestClient, Runtime]) -> None:
    """A 20M-character prompt is counted in the token process, not by the tokenizer on the server's
    threads (which held the GIL, /health included, for 0.5 to 2.5 s), and refused as too long."""
    client, runtime = served
    assert runtime.token_process is not None
    body = json.dumps({"model": "tiny", "max_tokens": 4,
                       "prompt": " ".join(f"w{i}" for i in range(3_400_000))[:20_000_000]}).encode()
    response, latencies = health_while_posting(client, "/v1/completions", body)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert runtime.token_process.counted == 1
    assert len(latencies) > 50, latencies
    # As the chat route's 20 MB Codex: 60-70 ms at worst when idle; room for a busy machine.
    assert max(latencies) < 0.25, f"/health took {max(latencies):.3f} s at worst during a 20 MB completion prompt"
