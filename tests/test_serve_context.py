"""The `context` field over real HTTP: sessions, the cache report, CAG/RAG, and its errors."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.engine

IDENTITY = "You are a patient physicist who studies a ring of cells. " * 8
CODEX = [{"id": "rules",
          "text": " ".join(f"Fact {i}: a particle A moves right by one cell each step." for i in range(30))}]


def chat(client, model, session, question, **context):
    return client.chat.completions.create(
        model=model, max_tokens=4, temperature=0, messages=[{"role": "user", "content": question}],
        extra_body={"context": {"session_id": session, "identity": IDENTITY, "codex": CODEX, **context}})


def report(reply) -> dict:
    return reply.to_dict()["context"]


def test_a_session_reuses_its_prefix_and_reports_what_changed(client, model_name) -> None:
    first = chat(client, model_name, "ctx-s1", "What moves?")
    second = chat(client, model_name, "ctx-s1", "And then? " * 16)
    r1, r2 = report(first), report(second)
    assert r1["session_id"] == "ctx-s1" and r1["mode"] == "cag"
    assert [b["name"] for b in r1["blocks"]] == ["identity", "codex", "karma", "state", "query"]
    assert r1["first_changed_block"] is None and r2["first_changed_block"] == "state"
    assert r1["blocks"][0]["sha256"] == r2["blocks"][0]["sha256"]
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the first turn is now State
    assert second.usage.prompt_tokens_details.cached_tokens >= 256
    # A new karma entry rides in State (staged), so the cached prefix survives it...
    third = chat(client, model_name, "ctx-s1", "Why?", karma=[{"id": "k1", "text": "B moves left."}])
    assert report(third)["first_changed_block"] == "state"
    # (A rewritten Karma block would have left the whole ~64-token second question uncached.)
    assert third.usage.prompt_tokens_details.cached_tokens >= second.usage.prompt_tokens - 32
    # ...while editing an entry rewrites the Karma block, and the report says so.
    fourth = chat(client, model_name, "ctx-s1", "Sure?", karma=[{"id": "k1", "text": "B moves right."}])
    assert report(fourth)["first_changed_block"] == "karma"


def test_without_context_the_request_passes_through_with_a_report(client, model_name) -> None:
    reply = client.chat.completions.create(model=model_name, max_tokens=2,
                                           messages=[{"role": "user", "content": "plain"}])
    r = report(reply)
    assert r["mode"] == "passthrough" and r["session_id"].startswith("sess-")


def test_streaming_carries_the_report_in_the_first_chunk(client, model_name) -> None:
    chunks = list(client.chat.completions.create(
        model=model_name, max_tokens=6, temperature=0, stream=True,
        messages=[{"role": "user", "content": "stream it"}],
        extra_body={"context": {"session_id": "ctx-stream", "identity": IDENTITY}}))
    first = chunks[0].to_dict()
    assert first["context"]["session_id"] == "ctx-stream"
    assert all("context" not in c.to_dict() for c in chunks[1:])
    again = chat(client, model_name, "ctx-stream", "more")
    assert report(again)["first_changed_block"] in ("codex", "state")


def test_rag_mode_retrieves_instead_of_injecting(client, model_name, server) -> None:
    cag = chat(client, model_name, "ctx-rag-a", "Which way does A move?", mode="cag")
    rag = chat(client, model_name, "ctx-rag-b", "Which way does A move?", mode="rag")
    assert report(rag)["mode"] == "rag"
    codex_block = next(b for b in report(rag)["blocks"] if b["name"] == "codex")
    assert codex_block["tokens"] == 0
    assert rag.usage.prompt_tokens != cag.usage.prompt_tokens
    with server.http() as http:
        found = http.post("/v1/context/query_archive", json={"query": "particle moves right", "k": 2})
        assert found.status_code == 200, found.text
        assert [r["doc_id"] for r in found.json()["results"]] == ["rules", "rules"]
        bad = http.post("/v1/context/query_archive", json={"k": 2})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        mine = http.post("/v1/context/query_archive", json={"query": "particle", "k": 1, "session_id": "ctx-rag-b"})
        assert mine.status_code == 200 and mine.json()["results"][0]["doc_id"] == "rules"
        never = http.post("/v1/context/query_archive", json={"query": "particle", "session_id": "ctx-rag-none"})
        assert never.status_code == 400 and "ctx-rag-none" in never.json()["error"]["message"]


@pytest.mark.parametrize("context, field", [
    ({"mode": "sideways"}, "context.mode"),
    ({"codex": [{"id": "x"}]}, "context.codex.0.text"),
    ({"karma": [{"id": "k", "text": "t", "verbatim": "maybe"}]}, "context.karma.0.verbatim"),
    ("not an object", "context"),
])
def test_malformed_context_is_400_naming_the_field(server, model_name, context, field) -> None:
    with server.http() as http:
        response = http.post("/v1/chat/completions", json={
            "model": model_name, "messages": [{"role": "user", "content": "q"}], "context": context})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]


def test_a_codex_past_the_limits_is_413_naming_the_limit(server, model_name) -> None:
    huge = [{"id": "big", "text": "x" * 2_000_001}]
    with server.http() as http:
        response = http.post("/v1/chat/completions", json={
            "model": model_name, "messages": [{"role": "user", "content": "q"}], "context": {"codex": huge}})
    assert response.status_code == 413
    assert "max_document_chars" in response.json()["error"]["message"]


def test_tool_calls_and_results_join_the_session_state(client, model_name) -> None:
    context = {"context": {"session_id": "ctx-tools", "identity": IDENTITY}}
    first = client.chat.completions.create(model=model_name, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "probe cell 3"}], extra_body=context)
    # The model's tool call (written here: a random model's JSON is not the point) and its result.
    call = {"id": "call-1", "type": "function", "function": {"name": "probe", "arguments": '{"cell": "c3"}'}}
    second = client.chat.completions.create(
        model=model_name, max_tokens=4, temperature=0, extra_body=context,
        messages=[{"role": "assistant", "content": "", "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call-1", "content": json.dumps({"symbol": "A"})}])
    r = report(second)
    assert r["first_changed_block"] == "state"
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10
    third = chat(client, model_name, "ctx-tools", "and now?")
    assert third.usage.prompt_tokens > second.usage.prompt_tokens


def test_context_metrics_count_modes_and_block_tokens(server, client, model_name) -> None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    chat(client, model_name, "ctx-metrics", "count me")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(httpx.get(f"{server.base_url}/metrics").text) for s in f.samples}
    model = ("model_name", model_name)
    assert samples[("ahc_context_mode_total", (("mode", "cag"), model))] >= 1
    assert samples[("ahc_context_block_tokens_sum", (("block", "codex"), model))] > 0
    assert samples[("ahc_context_block_tokens_count", (("block", "codex"), model))] >= 1
