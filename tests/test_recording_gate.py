"""XDB's back-pressure reaches every vLLM route that can generate, not only AHC's chat route: while the
writer is behind, a new request on any of them waits, then is refused with 503 and `Retry-After`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_app import serving
from fastapi.routing import APIRoute

from core.config import AHCConfig
from server.admission.recording_gate import gated
from server.recording.record_queue import RecordQueue

# vLLM's POST routes that generate nothing, so XDB's backlog does not hold them up. A route a later vLLM
# adds is gated until it is named in server/admission/recording_gate.py, and then here.
UNGATED_VLLM = {"/tokenize", "/detokenize", "/ping", "/v1/messages/count_tokens", "/v1/responses/{response_id}/cancel",
                "/v1/chat/completions/render", "/v1/messages/render", "/v1/completions/render",
                "/v1/responses/render", "/v1/chat/completions/derender", "/v1/completions/derender"}


def test_every_generating_route_is_gated(config: AHCConfig, vllm_config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with serving(config, vllm_config, tmp_path) as (client, _):
        posts = {r.path for r in client.app.routes if isinstance(r, APIRoute) and "POST" in r.methods}  # type: ignore[attr-defined]
    ours = {p for p in posts if p == "/v1/chat/completions" or p.startswith(("/v1/xdb/", "/v1/context/"))}
    ungated = {p for p in posts - ours if not gated(p.replace("{response_id}", "resp-1"))}
    assert ungated == UNGATED_VLLM & posts
    assert {"/v1/completions", "/v1/responses", "/v1/messages"} <= {p for p in posts if gated(p)}


def test_a_backlog_refuses_new_generations_on_every_door(config: AHCConfig, vllm_config, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    completion = {"model": "tiny", "prompt": "Hi", "max_tokens": 3}
    messages = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}
    with serving(config, vllm_config, tmp_path, **{"orchestrator.recording_wait_s": 0.2}) as (client, runtime):
        assert client.post("/v1/completions", json=completion).status_code == 200
        monkeypatch.setattr(RecordQueue, "over_backlog", property(lambda self: True))
        for path, body in (("/v1/completions", completion), ("/v1/messages", messages),
                           ("/v1/responses", {"model": "tiny", "input": "Hi", "max_output_tokens": 3})):
            refused = client.post(path, json=body)
            assert refused.status_code == 503, (path, refused.text)
            # each door in its API's own shape: Anthropic's for the Messages API
            expected = "overloaded_error" if path == "/v1/messages" else "server_error"
            assert refused.headers["retry-after"] and refused.json()["error"]["type"] == expected
        assert client.post("/tokenize", json={"model": "tiny", "prompt": "Hi"}).status_code == 200
        monkeypatch.undo()
        assert client.post("/v1/completions", json=completion).status_code == 200
