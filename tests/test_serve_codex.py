"""Codex by reference and condensed renditions over real HTTP, on the real engine."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.engine

IDENTITY = "You are a patient physicist who studies a ring of cells."
RULES = " ".join(f"Fact {i}: a particle of kind {i % 5} moves right by {i % 3} cells each step." for i in range(12))
# ~1,460 tokens: over 0.7 of the 2,048-token window with the rest of the prompt, so auto mode would
# leave it out for RAG, yet short enough for the model to condense in one call.
BIG = " ".join(f"Rule {i}: a particle of kind {i % 7} moves {i % 3} cells to the right each step." for i in range(64))


def chat(client, model, session, codex, question="What moves?"):
    reply = client.chat.completions.create(
        model=model, max_tokens=4, temperature=0, messages=[{"role": "user", "content": question}],
        extra_body={"context": {"session_id": session, "identity": IDENTITY, "codex": codex}})
    return reply, reply.to_dict()["context"]


def test_a_codex_named_by_reference_is_the_stored_version_byte_for_byte(server, client, model_name) -> None:
    with server.http() as http:
        doc = http.post("/v1/xdb/documents", json={"name": "ring-rules", "content": RULES}).json()
        http.post(f"/v1/xdb/documents/{doc['id']}", json={"content": RULES + " Fact 12: nothing else moves."})
    _, inline = chat(client, model_name, "codex-inline", [{"id": "ring-rules", "text": RULES}])
    _, by_version = chat(client, model_name, "codex-ref", [{"document": "ring-rules", "version": 1}])
    assert by_version["prefix_sha256"] == inline["prefix_sha256"]  # the same prompt, token for token
    [entry] = by_version["codex"]
    assert entry["document"] == doc["id"] and entry["version"] == 1 and entry["rendition"] == "full"
    # The next turn reads the pinned version again: the cache holds everything before the new turn.
    second, again = chat(client, model_name, "codex-ref", [{"document": doc["id"], "version": 1}], "And then?")
    assert again["first_changed_block"] == "state"
    assert second.usage.prompt_tokens_details.cached_tokens >= 200
    _, latest = chat(client, model_name, "codex-latest", [{"document": "ring-rules"}])
    assert latest["codex"][0]["version"] == 2


def test_a_missing_document_is_a_400_naming_the_entry(client, model_name) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        chat(client, model_name, "codex-missing", [{"document": "no-such-document"}])
    body = info.value.body
    assert body["param"] == "context.codex.0" and "not found" in body["message"]


def test_a_large_codex_is_condensed_before_rag_and_the_report_says_so(server, client, model_name) -> None:
    with server.http(timeout=300) as http:
        doc = http.post("/v1/xdb/documents", json={"name": "big-rules", "content": BIG}).json()
        assert http.get(f"/v1/xdb/documents/{doc['id']}/condensed").status_code == 404
        # Without a rendition the first request goes RAG and asks for one in the background.
        _, first = chat(client, model_name, "codex-dense", [{"document": "big-rules"}])
        assert first["mode"] == "rag" and first["codex"][0]["rendition"] == "excerpts"
        made = http.post(f"/v1/xdb/documents/{doc['id']}/condensed")  # joins (or finds) that background run
        assert made.status_code == 200, made.text
        rendition = made.json()
        assert "condensed" in rendition["tags"] and rendition["source"] == f"{doc['id']}@1"
        assert len(rendition["content"]) < len(BIG)
        deadline = time.monotonic() + 30
        while (stored := http.get(f"/v1/xdb/documents/{doc['id']}/condensed")).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert stored.json()["id"] == rendition["id"]
    _, second = chat(client, model_name, "codex-dense", [{"document": "big-rules"}], "And then?")
    assert second["mode"] == "cag" and "codex_condensed" in second["governor"]
    assert second["codex"][0]["rendition"] == "condensed"
    assert second["codex"][0]["condensed_document"] == f"{rendition['id']}@{rendition['version']}"
    codex_tokens = next(b["tokens"] for b in second["blocks"] if b["name"] == "codex")
    assert 0 < codex_tokens < 0.7 * 2048
    # Verbatim: never condensed, so RAG again.
    _, verbatim = chat(client, model_name, "codex-verbatim", [{"document": "big-rules", "verbatim": True}])
    assert verbatim["mode"] == "rag" and verbatim["codex"][0]["rendition"] == "excerpts"
