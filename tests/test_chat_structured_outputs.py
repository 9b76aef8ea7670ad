"""A `structured_outputs` that is not an object is a 400 in OpenAI's error shape: vLLM's own validator
reads it as an object and answered 500 (found by the route fuzzer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_app import serving

from core.config import AHCConfig


@pytest.mark.parametrize("value", ["", "json", ["regex"], 3])
def test_a_structured_outputs_that_is_not_an_object_is_a_400(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                              tmp_path: Path, value: object) -> None:
    with serving(config, vllm_config, tmp_path) as (client, _):
        bad = client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 2, "structured_outputs": value,
            "messages": [{"role": "user", "content": "hi"}]})
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert error["type"] == "invalid_request_error" and "structured_outputs must be an object" in error["message"]
        fine = client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 2, "structured_outputs": None,
            "messages": [{"role": "user", "content": "hi"}]})
        assert fine.status_code == 200, fine.text
