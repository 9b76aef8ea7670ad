"""What the server records in XDB, read back over `/v1/xdb/*`, and its durability across kill -9."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bench.servers import recall, recall_until, scrape_metrics, start_server
from server.cluster.server_process import free_port
from xdb.service.service import PROCESS_TITLE

pytestmark = pytest.mark.engine


def test_every_generated_token_is_a_row_and_they_concatenate_to_the_reply(server, client, model_name) -> None:
    reply = client.chat.completions.create(
        model=model_name, max_tokens=12, temperature=0, messages=[{"role": "user", "content": "record me"}],
        extra_body={"context": {"session_id": "xdb-s1", "identity": "You record."}})
    n = reply.usage.completion_tokens
    tokens = recall_until(server, n, session_id="xdb-s1", event_types="output")
    assert len(tokens) == n
    assert "".join(t["content"] for t in tokens) == reply.choices[0].message.content
    ticks = [t["tick"] for t in tokens]
    assert ticks == sorted(ticks) and len(set(ticks)) == n
    assert all(isinstance(t["token_id"], int) for t in tokens)
    # cpu-tiny.yaml captures with the tiny-demo lens pack (tests/test_activations.py checks the values).
    assert all(t["activation_source"] == "hidden_state" and 0 < len(t["concept_activations"]) <= 10
               for t in tokens)
    inputs = recall(server, session_id="xdb-s1", event_types="input")
    assert [i["content"] for i in inputs] == ["record me"]
    assert inputs[0]["tick"] < ticks[0]


def test_a_request_without_session_gets_one_and_streams_are_recorded(server, client, model_name) -> None:
    chunks = list(client.chat.completions.create(
        model=model_name, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "stream and record"}]))
    session = chunks[0].to_dict()["context"]["session_id"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = recall_until(server, chunks[-1].usage.completion_tokens, session_id=session, event_types="output")
    assert "".join(t["content"] for t in tokens) == text


def xdb_service(server) -> psutil.Process:
    [service] = [p for p in psutil.Process(server.process.pid).children() if p.name() == PROCESS_TITLE[:15]
                 or PROCESS_TITLE in " ".join(p.cmdline())]
    return service


def test_a_killed_xdb_service_is_restarted_mid_reply_and_every_token_recorded(server, client, model_name) -> None:
    service = xdb_service(server)
    restarts = scrape_metrics(server.base_url).get("ahc_xdb_service_restarts_total", 0)
    stream = client.chat.completions.create(
        model=model_name, max_tokens=48, temperature=0, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "survive a crash"}],
        extra_body={"context": {"session_id": "xdb-restart"}})
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 3:
            service.kill()  # SIGKILL: the rows it had not committed are gone with it
    n = chunks[-1].usage.completion_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = recall_until(server, n, session_id="xdb-restart", event_types="output")
    assert [t["tick"] for t in tokens] == list(range(tokens[0]["tick"], tokens[0]["tick"] + n))
    assert "".join(t["content"] for t in tokens) == text
    assert xdb_service(server).pid != service.pid
    assert scrape_metrics(server.base_url)["ahc_xdb_service_restarts_total"] == restarts + 1


def test_tool_calls_and_results_are_recorded(server, client, model_name, no_whitespace_bias) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "strict": True, "description": "Weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                           "required": ["city"], "additionalProperties": False}}}
    context = {"context": {"session_id": "xdb-tools"}}
    first = client.chat.completions.create(model=model_name,
                                           messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                           tools=[tool], tool_choice="required", max_tokens=64, temperature=0,
                                           logit_bias=no_whitespace_bias, parallel_tool_calls=False,
                                           extra_body=context)
    calls = first.choices[0].message.tool_calls
    assert calls
    recorded = recall_until(server, len(calls), session_id="xdb-tools", event_types="tool_call")
    assert [r["content"] for r in recorded][0].count("get_weather") == 1
    client.chat.completions.create(model=model_name, max_tokens=2, extra_body=context,
                                   messages=[{"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"}])
    results = recall_until(server, 1, session_id="xdb-tools", event_types="tool_result")
    assert [r["content"] for r in results] == ["sunny"]


def test_tags_comments_and_bad_filters(server, client, model_name) -> None:
    client.chat.completions.create(model=model_name, max_tokens=3, messages=[{"role": "user", "content": "tag me"}],
                                   extra_body={"context": {"session_id": "xdb-tags"}})
    row = recall_until(server, 1, session_id="xdb-tags", event_types="input")[0]
    with server.http() as http:
        assert http.post("/v1/xdb/tag", json={"tag": "important", "timestep_id": row["id"]}).status_code == 200
        assert http.post("/v1/xdb/comment", json={"content": "why", "timestep_id": row["id"]}).status_code == 200
        missing = http.post("/v1/xdb/tag", json={"tag": "x", "timestep_id": 10**12})
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        bad = http.get("/v1/xdb/recall", params={"tick_from": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tick_from"
        assert http.get("/v1/xdb/state").status_code == 200
    tagged = recall(server, tags="important")
    assert [t["id"] for t in tagged] == [row["id"]] and "important" in tagged[0]["tags"]


def test_audit_log_records_are_not_reachable_over_http(server) -> None:
    """Only the chain's head and its verification are served (the browser's audit page), never a record."""
    with server.http() as http:
        for path in ("/audit/audit.duckdb", "/v1/xdb/audit/audit.duckdb", "/v1/xdb/verify-audit",
                     "/v1/xdb/audit/records", "/v1/xdb/audit/1"):
            assert http.get(path).status_code == 404, path
        summary = http.get("/v1/xdb/audit").json()
        assert set(summary) == {"head_seq", "head_sha256", "last_verification"}
        assert isinstance(summary["head_seq"], int) and len(summary["head_sha256"]) == 64
        verified = http.post("/v1/xdb/audit/verify").json()
        assert verified["ok"] is True and isinstance(verified["records_checked"], int)
        assert "content" not in json.dumps(verified) and "content" not in json.dumps(summary)


@pytest.mark.slow
def test_kill_9_keeps_completed_replies_and_sessions_resume(tmp_path: Path) -> None:
    data = tmp_path / "xdb"
    port = free_port()
    first = start_server(data, port=port, api_key=None)
    client = first.client()
    model = client.models.list().data[0].id
    context = {"context": {"session_id": "durable", "identity": "You persist."}}
    replies = [client.chat.completions.create(model=model, max_tokens=6, temperature=0, extra_body=context,
                                              messages=[{"role": "user", "content": f"turn {i}"}]) for i in range(3)]
    engine_processes = psutil.Process(first.process.pid).children(recursive=True)
    assert engine_processes, "vLLM's engine runs in processes of its own"
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(30)
    # vLLM's engine processes hold the model and its KV cache: they must not outlive the server.
    _, alive = psutil.wait_procs(engine_processes, timeout=30)
    assert not alive, f"engine processes outlived a SIGKILL of ahc serve: {[p.pid for p in alive]}"

    second = start_server(data, port=port, api_key=None)
    try:
        tokens = recall(second, session_id="durable", event_types="output")
        assert len(tokens) == sum(r.usage.completion_tokens for r in replies)
        resumed = second.client().chat.completions.create(
            model=model, max_tokens=2, extra_body=context, messages=[{"role": "user", "content": "turn 3"}])
        report = resumed.to_dict()["context"]
        assert report["first_changed_block"] == "state"  # the session's history came back from XDB
        assert resumed.usage.prompt_tokens > replies[-1].usage.prompt_tokens
    finally:
        assert second.stop() == 0
    ahc = str(Path(sys.executable).with_name("ahc"))
    verify = subprocess.run([ahc, "xdb", "verify-audit", "--data-dir", str(data)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr


def test_compaction_through_the_api_summarises_with_the_served_model(server, client, model_name) -> None:
    client.chat.completions.create(model=model_name, max_tokens=6, messages=[{"role": "user", "content": "compact me"}],
                                   extra_body={"context": {"session_id": "xdb-compact"}})
    with server.http() as http:
        response = http.post("/v1/xdb/compact", json={"session_id": "xdb-compact"}, timeout=300)
    assert response.status_code == 200, response.text
    record = response.json()["compaction"]
    assert record is not None and record["summary"].strip()
