"""The emulated engine draws its tokens without a model, so it cannot hold a reply to a grammar: a request
asking for one (a forced tool call, a JSON schema) is the API's own 400 naming the emulation, on every
door, and leaves no session behind. On AHC's whole app (fake engine, TestClient, a real XDB) configured
as `--emulate` configures it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_app import serving
from vllm.config import VllmConfig

from core.config import AHCConfig
from xdb.owner import EVERY
from xdb.session_state import list_sessions

TOOL = {"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}
MESSAGES_TOOL = {"name": "look", "input_schema": {"type": "object", "properties": {}}}
RESPONSES_TOOL = {"type": "function", "name": "look", "parameters": {"type": "object", "properties": {}}}
CHAT = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Look."}]}

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": {"type": "function",
                                                                       "function": {"name": "look"}}}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/messages", {**CHAT, "tools": [MESSAGES_TOOL], "tool_choice": {"type": "any"}}, "tool_choice"),
    ("/v1/responses", {"model": "tiny", "input": "Look.", "tools": [RESPONSES_TOOL], "tool_choice": "required"},
     "tool_choice"),
]


def test_a_grammar_request_is_a_400_naming_the_emulation_and_leaves_no_session(
        config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path) -> None:
    with serving(config, vllm_config, tmp_path, **{"engine.emulate": "h100-llama-8b"}) as (http, runtime):
        for path, body, param in REFUSED:  # one app for every case: each starts in seconds
            response = http.post(path, json=body)
            assert response.status_code == 400, (path, body, response.text)
            error = response.json()["error"]
            assert "emulated engine (h100-llama-8b)" in error["message"]
            if path != "/v1/messages":  # the Messages API's error names no parameter
                assert error["param"] == param
        auto = http.post("/v1/chat/completions", json={**CHAT, "tools": [TOOL], "tool_choice": "auto"})
        assert auto.status_code == 200
        runtime.xdb.writer.flush()
        assert len(runtime.xdb.read(list_sessions, EVERY, 100)) == 1  # the auto request's; none of the refused
