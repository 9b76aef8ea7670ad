"""Sessions named the ways the ecosystem names them, over real HTTP: the `X-Session-ID` header and
OpenAI's `prompt_cache_key` record an ordinary client's turns under one session and report where its
prefix changed, `context.session_id` also keeps the State, and the response echoes the id."""

from __future__ import annotations

import pytest

from bench.servers import recall, recall_until

pytestmark = pytest.mark.engine

SYSTEM = "You are a careful physicist who studies a ring of cells and answers briefly. " * 6


def ask(client, model, messages, **kwargs):
    raw = client.chat.completions.with_raw_response.create(model=model, max_tokens=3, temperature=0,
                                                             messages=messages, **kwargs)
    return raw.headers, raw.parse()


def test_a_header_session_records_an_ordinary_client_and_hits_the_cache(server, client, model_name) -> None:
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What moves first?"}]
    headers1, first = ask(client, model_name, history, extra_headers={"X-Session-ID": "hdr-1"})
    history += [{"role": "assistant", "content": first.choices[0].message.content or "-"},
                {"role": "user", "content": "And after that?"}]
    headers2, second = ask(client, model_name, history, extra_headers={"X-Session-ID": "hdr-1"})
    assert headers1["x-session-id"] == headers2["x-session-id"] == "hdr-1"
    r1, r2 = first.to_dict()["context"], second.to_dict()["context"]
    assert r1["session_id"] == r2["session_id"] == "hdr-1"
    assert r1["mode"] == "passthrough" and r1["first_changed_block"] is None
    assert r2["first_changed_block"] == "state"  # the resent history extends the last prompt
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    # Each turn's new input once, not the resent history again.
    inputs = recall_until(server, 2, session_id="hdr-1", event_types="input")
    assert [r["content"] for r in inputs] == ["What moves first?", "And after that?"]
    ticks = [r["tick"] for r in recall(server, session_id="hdr-1")]
    assert len(ticks) == len(set(ticks))  # one timeline: no tick used twice
    outputs = recall(server, session_id="hdr-1", event_types="output")
    assert len(outputs) == first.usage.completion_tokens + second.usage.completion_tokens


def test_prompt_cache_key_names_the_session_like_the_header(server, client, model_name) -> None:
    headers, reply = ask(client, model_name, [{"role": "user", "content": "Key it"}],
                         extra_body={"prompt_cache_key": "pck-1"}, stream=False)
    assert headers["x-session-id"] == "pck-1" and reply.to_dict()["context"]["session_id"] == "pck-1"
    assert recall_until(server, 1, session_id="pck-1", event_types="input")[0]["content"] == "Key it"


def test_context_session_with_the_same_header_keeps_its_state(client, model_name) -> None:
    context = {"session_id": "hdr-ctx", "identity": SYSTEM}
    for question in ("One?", "Two?"):
        headers, reply = ask(client, model_name, [{"role": "user", "content": question}],
                             extra_body={"context": context}, extra_headers={"X-Session-ID": "hdr-ctx"})
        assert headers["x-session-id"] == "hdr-ctx"
    report = reply.to_dict()["context"]
    assert report["first_changed_block"] == "state"
    state = next(b for b in report["blocks"] if b["name"] == "state")
    assert state["tokens"] > 0  # the first turn was kept by the server, not resent


def test_a_session_without_a_name_gets_one_in_the_header(client, model_name) -> None:
    headers, reply = ask(client, model_name, [{"role": "user", "content": "anonymous"}])
    assert headers["x-session-id"] == reply.to_dict()["context"]["session_id"]
    assert headers["x-session-id"].startswith("sess-")


def test_a_streamed_reply_echoes_the_session(server, model_name) -> None:
    with server.http() as http, http.stream(
            "POST", "/v1/chat/completions", headers={"X-Session-ID": "hdr-stream"},
            json={"model": model_name, "max_tokens": 3, "stream": True,
                  "messages": [{"role": "user", "content": "stream"}]}) as response:
        assert response.status_code == 200 and response.headers["x-session-id"] == "hdr-stream"
        body = "".join(response.iter_text())
    assert body.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize(("headers", "body", "param"), [
    ({"X-Session-ID": "a"}, {"context": {"session_id": "b"}}, "X-Session-ID"),
    ({"X-Session-ID": "a"}, {"prompt_cache_key": "b"}, "prompt_cache_key"),
    ({}, {"context": {"session_id": "a"}, "prompt_cache_key": "b"}, "prompt_cache_key"),
    ({"X-Session-ID": ""}, {}, "X-Session-ID"),
    ({}, {"prompt_cache_key": 7}, "prompt_cache_key"),
])
def test_conflicting_or_bad_session_names_are_a_400(server, model_name, headers, body, param) -> None:
    with server.http() as http:
        response = http.post("/v1/chat/completions", headers=headers,
                             json={"model": model_name, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "which?"}], **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_completions_record_under_the_header_session(server, client, model_name) -> None:
    for prompt in ("First prompt", "Second prompt"):
        raw = client.completions.with_raw_response.create(model=model_name, prompt=prompt, max_tokens=2,
                                                          extra_headers={"X-Session-ID": "hdr-cmpl"})
        assert raw.headers["x-session-id"] == "hdr-cmpl"
    inputs = recall_until(server, 2, session_id="hdr-cmpl", event_types="input")
    assert [r["content"] for r in inputs] == ["First prompt", "Second prompt"]
    assert [r["tick"] for r in inputs] == sorted({r["tick"] for r in inputs})

