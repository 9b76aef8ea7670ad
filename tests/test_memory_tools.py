"""XDB's memory verbs as the model's tools: offered when a request names them in `context.memory_tools`,
run by the client at `POST /v1/context/memory` on the session's own rows under its key, a bad argument
answered to the model as the tool's result; a compaction asked for is recorded as `manual`.
AHC's whole app on the fake engine (tests/fake_app.py), a real XDB."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli_runner import ahc
from fake_app import serving
from fastapi.testclient import TestClient

from core.config import AHCConfig
from orchestrator.memory_tools import MEMORY_TOOL_NAMES, MEMORY_TOOLS
from server.runtime import Runtime
from xdb import XDB


def chat(session: str, words: str, tools: list[str] | None = None) -> dict[str, Any]:
    context: dict[str, Any] = {"session_id": session, "identity": "You remember."}
    if tools is not None:
        context["memory_tools"] = tools
    return {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": words}], "context": context}


def memory(client: TestClient, session: str, name: str, arguments: Any) -> dict[str, Any]:
    reply = client.post("/v1/context/memory", json={"session_id": session, "name": name, "arguments": arguments})
    assert reply.status_code == 200, reply.text
    assert reply.json()["name"] == name
    return reply.json()["result"]  # type: ignore[no-any-return]


def last_prompt(runtime: Runtime) -> str:
    engine = runtime.hidden.engine  # type: ignore[attr-defined]
    return str(engine.get_tokenizer().decode(engine.requests[-1].prompt_token_ids))


def test_named_verbs_are_offered_and_run_on_the_session(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                       tmp_path: Path) -> None:
    with serving(config, vllm_config, tmp_path) as (client, runtime):
        said = client.post("/v1/chat/completions", json=chat("m", "The red key opens the north door."))
        assert said.status_code == 200
        assert "recall" not in last_prompt(runtime)  # none unless named
        reply = client.post("/v1/chat/completions", json=chat("m", "Which door?", ["recall", "tag"]))
        assert reply.status_code == 200, reply.text
        prompt = last_prompt(runtime)
        assert MEMORY_TOOLS["recall"]["function"]["description"] in prompt and '"tag"' in prompt
        assert MEMORY_TOOLS["pin"]["function"]["description"] not in prompt
        runtime.xdb.writer.flush()

        found = memory(client, "m", "recall", '{"text": "north door"}')
        [moment] = found["moments"]
        assert moment["content"] == "The red key opens the north door." and moment["event_type"] == "input"
        tick = moment["tick"]
        assert memory(client, "m", "tag", {"tag": "door-fact", "tick_from": tick})["ticks"] == [tick, tick]
        assert [m["tick"] for m in memory(client, "m", "recall", {"tag": "door-fact"})["moments"]] == [tick]
        assert memory(client, "m", "comment", {"tick": tick, "content": "the key is red"})["commented"] == tick
        assert memory(client, "m", "pin", {"tick_from": tick, "tick_to": tick + 1})["pinned"] == [tick, tick + 1]
        assert memory(client, "other", "recall", {"text": "north door"})["moments"] == []  # another session's rows


def test_a_bad_call_is_answered_to_the_model_and_a_bad_request_refused(  # type: ignore[no-untyped-def]
        config: AHCConfig, vllm_config, tmp_path: Path) -> None:
    with serving(config, vllm_config, tmp_path) as (client, _):
        assert memory(client, "m", "recall", "{not json")["error"]["message"].startswith("arguments are not valid JSON")
        error = memory(client, "m", "recall", {"limit": 99})["error"]
        assert error["type"] == "InvalidRequest" and error["message"].startswith("recall: limit: 99 is greater than")
        assert "tick_from" in memory(client, "m", "tag", {"tag": "x"})["error"]["message"]
        assert "before tick_from" in memory(client, "m", "pin", {"tick_from": 5, "tick_to": 2})["error"]["message"]
        assert "no State messages" in memory(client, "m", "request_compaction", {})["error"]["message"]
        refused = client.post("/v1/context/memory", json={"session_id": "m", "name": "drop_table", "arguments": {}})
        assert refused.status_code in (400, 422) and refused.json()["error"]["type"] == "invalid_request_error"
        refused = client.post("/v1/chat/completions", json=chat("m", "hi", ["recall", "recall"]))
        assert refused.status_code == 400 and "each tool is named once" in refused.json()["error"]["message"]
        assert set(MEMORY_TOOL_NAMES) == set(MEMORY_TOOLS)


def test_a_compaction_asked_for_is_recorded_as_manual(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                     tmp_path: Path) -> None:
    overrides = {"orchestrator.compaction_keep_turns": 0}
    with serving(config, vllm_config, tmp_path, **overrides) as (client, runtime):
        assert client.post("/v1/chat/completions", json=chat("c", "First, the rule.")).status_code == 200
        assert memory(client, "c", "request_compaction", {})["compaction_requested"] is True
        second = client.post("/v1/chat/completions", json=chat("c", "And then?", ["request_compaction"]))
        assert second.status_code == 200 and "compaction" in second.json()["context"]["governor"]
        runtime.background.submit(lambda: None).result()  # the record is written on the ordered worker
        xdb = runtime.xdb
        assert isinstance(xdb, XDB)
        assert xdb.conn.execute("SELECT trigger FROM compaction_records WHERE session_id = 'c'").fetchall() == [
            ("manual",)]


def test_ahc_mcp_refuses_a_base_url_that_is_not_http() -> None:
    result = ahc("mcp", "--base-url", "localhost:8000")
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        "error: --base-url 'localhost:8000': expected http://HOST:PORT"], result.stderr
