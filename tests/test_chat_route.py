"""AHC's whole app (routes, orchestrator, admission, recording, error handling) on the fake engine:
the request paths a real server takes, through FastAPI's TestClient, in milliseconds each."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
from chat_bodies import chat as chat_body
from fake_app import ahc_app, health_while_posting, serving
from fake_engine import FakeEngine
from fastapi.testclient import TestClient

from core.config import AHCConfig
from core.limits import IDENTITY_MAX_CHARS, KARMA_TEXT_MAX_CHARS, MESSAGE_MAX_CHARS
from orchestrator.turn import Turn
from server.chat import serving as chat_route
from server.runtime import Runtime
from server.tenancy.request_context import EngineUsage
from xdb import XDB
from xdb.owner import EVERY
from xdb.recall.browse import session_turns, sessions_overview

# This module's sessions carry a karma entry too.
chat = partial(chat_body, context={"karma": [{"id": "k1", "text": "A moves right.", "verbatim": True}]})


def test_a_session_turn_commits_its_reply_and_records_every_token(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    first = client.post("/v1/chat/completions", json=chat("s1"))
    assert first.status_code == 200, first.text
    report = first.json()["context"]
    assert report["session_id"] == "s1" and report["first_changed_block"] is None
    assert [b["name"] for b in report["blocks"]] == ["identity", "codex", "karma", "state", "query"]
    state = runtime.orchestrator.sessions.get("s1")
    assert [t.role for t in state.messages] == ["user", "assistant"]
    assert state.messages[1].content == first.json()["choices"][0]["message"]["content"]

    second = client.post("/v1/chat/completions", json=chat("s1", "And then?"))
    assert second.json()["context"]["first_changed_block"] == "state"  # the prefix held up to the State
    assert len(runtime.orchestrator.sessions.get("s1").messages) == 4
    runtime.xdb.writer.flush()
    outputs = runtime.xdb.recall(session_id="s1", event_types=["output"], owner=EVERY)
    assert len(outputs) == first.json()["usage"]["completion_tokens"] + second.json()["usage"]["completion_tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_each_completed_turn_is_recorded_with_its_cache_report_and_usage(served: tuple[TestClient, Runtime],
                                                                        stream: bool) -> None:
    """The experience browser's turns: one record per reply, after its tokens, with the report the client
    got and the engine's usage."""
    client, runtime = served
    bodies = []
    for question in ("What moves?", "And then?"):
        body = chat("t1", question, stream=stream, stream_options={"include_usage": True} if stream else None)
        response = client.post("/v1/chat/completions", json={k: v for k, v in body.items() if v is not None})
        assert response.status_code == 200, response.text
        if stream:
            events = [json.loads(line[6:]) for line in response.text.split("\n") if line.startswith("data: {")]
            text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
            bodies.append({"context": events[0]["context"], "usage": events[-1]["usage"], "text": text})
        else:
            bodies.append({**response.json(), "text": response.json()["choices"][0]["message"]["content"]})
    runtime.xdb.writer.flush()
    turns = runtime.xdb.read(session_turns, "t1")["turns"]
    assert len(turns) == 2
    outputs = runtime.xdb.recall(session_id="t1", event_types=["output"], limit=1000, owner=EVERY)
    for turn, body in zip(turns, bodies):
        report, usage = body["context"], body["usage"]
        assert [turn["mode"], turn["blocks"], turn["first_changed_block"]] == \
            [report["mode"], report["blocks"], report["first_changed_block"]]
        assert turn["prompt_tokens"] == usage["prompt_tokens"]
        assert turn["completion_tokens"] == usage["completion_tokens"]
        mine = [r for r in outputs if turn["tick_from"] <= r["tick"] <= turn["tick_to"]]
        assert len(mine) == usage["completion_tokens"] and {r["request_id"] for r in mine} == {turn["request_id"]}
        assert turn["reply"] == "".join(r["content"] for r in mine) == body["text"]  # the reply the client got
    assert turns[0]["reason"] == "first turn: nothing cached yet"
    assert turns[1]["first_changed_block"] == "state" and turns[1]["reason"].startswith("state grew")
    overview = {s["session_id"]: s for s in runtime.xdb.read(sessions_overview, owner=EVERY)}["t1"]
    assert overview["turns"] == 2 and overview["mode"] == "cag"
    assert overview["prompt_tokens"] == sum(b["usage"]["prompt_tokens"] for b in bodies)


def test_a_session_dropped_from_memory_takes_its_rag_index_file_along(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                                        tmp_path: Path) -> None:
    with serving(config, vllm_config, tmp_path, **{"orchestrator.max_sessions": 1}) as (client, runtime):
        indexes = runtime.rag_indexes
        with indexes.using("s1"):  # the file a RAG request of s1 leaves (without loading the embedder)
            pass
        assert client.post("/v1/chat/completions", json=chat("s1")).status_code == 200
        assert indexes.exists("s1")
        assert client.post("/v1/chat/completions", json=chat("s2")).status_code == 200  # s1 leaves memory
        runtime.background.submit(lambda: None).result()  # the index is deleted off the event loop
        assert not indexes.exists("s1") and not indexes.path_of("s1").exists()
        # Its State is still in XDB: s1 resumes where it was.
        assert client.post("/v1/chat/completions", json=chat("s1", "And then?")).status_code == 200
        assert len(runtime.orchestrator.sessions.get("s1").messages) == 4


def test_a_streamed_turn_reports_in_its_first_chunk_and_commits_at_the_end(
        served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    with client.stream("POST", "/v1/chat/completions", json=chat("s2", stream=True)) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert '"context"' in events[0] and '"session_id": "s2"' in events[0]
    state = runtime.orchestrator.sessions.get("s2").messages
    assert [m.role for m in state] == ["user", "assistant"]
    streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                       if json.loads(e)["choices"])
    assert streamed and state[1].content == streamed  # the State has the whole reply, every chunk of it
    assert not runtime.orchestrator.sessions.lock("s2").locked()


def assert_split_at_the_finish(received: list[str], sent: list[str]) -> None:
    """`received` is vLLM's `sent` events but for the first (the report added, checked apart) and the
    finishing chunk, which goes out as two: its tokens, then the finish with an empty delta (held
    until the reply is durable)."""
    at = next(i for i, event in enumerate(sent) if '"finish_reason":"stop"' in event)
    assert received[1:at] == sent[1:at] and received[at + 2:] == sent[at + 1:]
    vllm, tokens, finish = (json.loads(e.removeprefix("data: ")) for e in (sent[at], *received[at:at + 2]))
    choice = vllm["choices"][0]
    assert choice["delta"].get("content"), "the last chunk carried the reply's last token"
    tokens_choice = {key: value for key, value in choice.items() if key != "stop_reason"}
    unfinished = {key: value for key, value in vllm.items() if key != "system_fingerprint"}  # a terminal chunk's
    assert tokens == {**unfinished, "choices": [{**tokens_choice, "finish_reason": None}]}
    assert finish == {**vllm, "choices": [{**choice, "delta": {}}]}


@dataclass
class StreamSpy:
    """What vLLM's chat handler streamed into the route, and the payloads the route parsed."""

    from_vllm: list[str] = field(default_factory=list)
    parsed: list[str] = field(default_factory=list)

    def events(self) -> list[str]:
        return "".join(self.from_vllm).split("\n\n")


def spy_on_stream(monkeypatch: pytest.MonkeyPatch) -> StreamSpy:
    spy = StreamSpy()
    original = chat_route.stream_with_report

    def teeing(chunks: AsyncIterator[str | bytes], turn: Turn, runtime: Runtime,
               usage: EngineUsage | None = None) -> AsyncIterator[str | bytes]:
        async def tee() -> AsyncIterator[str | bytes]:
            async for chunk in chunks:
                spy.from_vllm.append(chunk.decode() if isinstance(chunk, bytes) else chunk)
                yield chunk
        return original(tee(), turn, runtime, usage)

    def loads(payload: str) -> object:
        spy.parsed.append(payload)
        return json.loads(payload)

    monkeypatch.setattr(chat_route, "stream_with_report", teeing)
    monkeypatch.setattr(chat_route, "json", SimpleNamespace(loads=loads, dumps=json.dumps))
    return spy


def test_a_stream_without_a_session_passes_vllms_chunks_through_unparsed(
        served: tuple[TestClient, Runtime], monkeypatch: pytest.MonkeyPatch) -> None:
    client, runtime = served
    spy = spy_on_stream(monkeypatch)
    body = chat(stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        received = response.read().decode().split("\n\n")
    sent = spy.events()
    assert len(sent) > 5 and sent[-2:] == ["data: [DONE]", ""]
    # Every chunk but the first and the finishing one goes out byte for byte as vLLM wrote it.
    assert_split_at_the_finish(received, sent)
    # The first is vLLM's with the report added.
    first = json.loads(received[0].removeprefix("data: "))
    assert first.pop("context")["session_id"].startswith("sess-")
    assert first == json.loads(sent[0].removeprefix("data: "))
    # No State keeps the reply and it has no tool call: only the report's chunk and the finish are read.
    finish = next(e for e in sent if '"finish_reason":"stop"' in e)
    assert spy.parsed == [sent[0].removeprefix("data: "), finish.removeprefix("data: ")]


def test_a_session_stream_passes_vllms_chunks_through(served: tuple[TestClient, Runtime],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    client, runtime = served
    spy = spy_on_stream(monkeypatch)
    with client.stream("POST", "/v1/chat/completions", json=chat("s-through", stream=True)) as response:
        received = response.read().decode().split("\n\n")
    assert len(received) > 5
    assert_split_at_the_finish(received, spy.events())
    assert json.loads(received[0].removeprefix("data: "))["context"]["session_id"] == "s-through"
    assert [t.role for t in runtime.orchestrator.sessions.get("s-through").messages] == ["user", "assistant"]


def test_a_tool_call_in_a_stream_without_a_session_is_recorded(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                               tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    script = tokenizer.encode(call, add_special_tokens=False)
    with serving(config, vllm_config, tmp_path, script=script) as (client, runtime):
        body = chat(stream=True, max_tokens=64, tools=[tool])
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: {")]
        session = json.loads(events[0])["context"]["session_id"]
        assert json.loads(events[-1])["choices"][0]["finish_reason"] == "tool_calls"
        runtime.xdb.writer.flush()
        rows = runtime.xdb.recall(session_id=session, event_types=["tool_call"], owner=EVERY)
    assert len(rows) == 1
    recorded = json.loads(rows[0]["content"])
    assert recorded["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert recorded["id"] and rows[0]["metadata"] == {"tool_call_id": recorded["id"]}


def test_a_request_without_context_records_its_new_input_messages(served: tuple[TestClient, Runtime]) -> None:
    """Like a request with `context` and no session: a new session holds the whole history it brings."""
    client, runtime = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is A?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "call-1", "type": "function", "function": {
                    "name": "locate", "arguments": '{"particle": "A"}'}}]},
                {"role": "tool", "tool_call_id": "call-1", "content": "x=3"},
                {"role": "user", "content": "And B?"}]

    def recorded(body: dict[str, object]) -> list[tuple[str, str, str]]:
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        runtime.xdb.writer.flush()
        rows = runtime.xdb.recall(session_id=response.json()["context"]["session_id"],
                                  event_types=["input", "tool_result", "system"], owner=EVERY)
        return [(r["event_type"], r["role"], r["content"]) for r in rows if "turn" not in (r["metadata"] or {})]

    passthrough = recorded({**chat(), "messages": messages})
    assert passthrough == [("input", "user", "Where is A?"), ("tool_result", "tool", "x=3"),
                           ("input", "user", "And B?")]
    assert recorded({**chat(), "messages": messages, "context": {}}) == passthrough


def test_a_request_the_kv_cache_cannot_hold_is_429_and_leaves_the_state(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    runtime.metrics.kv_stats.total_blocks, runtime.metrics.kv_stats.block_size = 4, 16  # 64 tokens in all
    response = client.post("/v1/chat/completions", json=chat("s3", max_tokens=500))
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "kv_cache_full"
    assert response.headers["retry-after"] == str(runtime.config.orchestrator.retry_after_s)
    assert runtime.orchestrator.sessions.get("s3").messages == []
    assert not runtime.orchestrator.sessions.lock("s3").locked()
    assert runtime.governor.free_blocks() == 4  # nothing stays reserved


@pytest.mark.parametrize("context, param", [({"mode": "sideways"}, "context.mode"),
                                            ({"codex": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]},
                                             "context.codex"),
                                            ({"formatter": "nope"}, "context.formatter"),
                                            ({"identity": "i" * (IDENTITY_MAX_CHARS + 1)}, "context.identity"),
                                            ({"karma": [{"id": "k", "text": "k" * (KARMA_TEXT_MAX_CHARS + 1)}]},
                                             "context.karma.0.text"),
                                            ({"codex": [{"id": "a", "text": "x"}, {"document": "d", "version": 0}]},
                                             "context.codex.1.version"),
                                            ({"codex": [{"document": "no-such-document"}]}, "context.codex.0")])
def test_a_bad_context_is_400_naming_the_field(served: tuple[TestClient, Runtime], context: dict[str, object],
                                               param: str) -> None:
    client, _ = served
    response = client.post("/v1/chat/completions", json={**chat(), "context": context})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and param in response.json()["error"]["message"]


def test_an_over_long_message_is_400_naming_it(served: tuple[TestClient, Runtime]) -> None:
    client, _ = served
    response = client.post("/v1/chat/completions", json=chat(question="q" * (MESSAGE_MAX_CHARS + 1)))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages" and "messages.0.content" in error["message"]


def test_a_bug_in_an_ahc_route_is_a_500_not_a_client_error(served: tuple[TestClient, Runtime],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    client, runtime = served

    def broken() -> None:
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(runtime.xdb, "state", broken)
    response = TestClient(client.app, raise_server_exceptions=False).get("/v1/xdb/state")
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"


def test_ahc_routes_are_typed_in_the_openapi_schema(served: tuple[TestClient, Runtime]) -> None:
    client, _ = served
    schema = client.get("/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/xdb/recall", "/v1/xdb/tag", "/v1/context/query_archive",
                 "/v1/xdb/interactions"):
        assert path in schema["paths"], path
    recall_params = {p["name"] for p in schema["paths"]["/v1/xdb/recall"]["get"]["parameters"]}
    assert {"session_id", "tick_from", "concept", "limit"} <= recall_params
    assert "context" in schema["components"]["schemas"]["ChatRequest"]["properties"]
    # The path documents AHC's body (with `context`), not the shadowed vLLM route's.
    chat_body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat_body["schema"]["$ref"].endswith("/ChatRequest")


def test_a_body_over_the_limit_is_413_before_it_is_read(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                        tmp_path: Path) -> None:
    big = json.dumps(chat(question="x" * 5000)).encode()
    with serving(config, vllm_config, tmp_path, max_request_bytes=4096) as (client, runtime):
        declared = client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
        assert declared.status_code == 413, declared.text
        assert declared.json()["error"] == {"message": "the request body is over the server's limit of 4,096 bytes",
                                            "type": "invalid_request_error", "param": None,
                                            "code": "request_too_large"}

        def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked, counted as it arrives
            for start in range(0, len(big), 1000):
                yield big[start:start + 1000]

        chunked = client.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert chunked.status_code == 413, chunked.text
        assert chunked.json()["error"]["code"] == "request_too_large"
        assert client.post("/v1/chat/completions", json=chat()).status_code == 200  # under the limit: served
        assert client.post("/v1/xdb/comment", content=b"{" + b" " * 5000 + b"}",
                           headers={"content-type": "application/json"}).status_code == 413


@pytest.mark.parametrize("declared", [[], [(b"content-length", b"10"), (b"transfer-encoding", b"chunked")]],
                         ids=["chunked", "a-small-length-beside-chunked"])
def test_a_body_cut_off_mid_stream_never_reaches_the_route(  # type: ignore[no-untyped-def]
        config: AHCConfig, vllm_config, tmp_path: Path, declared: list[tuple[bytes, bytes]]) -> None:
    """The chunk that passes the limit is the last one read: the app gets no more of the body. A
    Content-Length beside a transfer encoding is not trusted (h11 reads such a body as chunked)."""
    body = json.dumps(chat(question="x" * 5000)).encode()
    pieces = [body[i:i + 1000] for i in range(0, len(body), 1000)]

    async def scenario() -> tuple[list[dict[str, object]], int]:
        xdb = XDB.open(tmp_path / "xdb")
        app, runtime = await ahc_app(config.with_overrides(data_dir=str(tmp_path / "xdb"), max_request_bytes=2500),
                                     FakeEngine(vllm_config), xdb)
        served = 0
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            nonlocal served
            served += 1
            if served > len(pieces):
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": pieces[served - 1], "more_body": served < len(pieces)}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
                 "query_string": b"", "root_path": "", "scheme": "http", "server": ("127.0.0.1", 8000),
                 "client": ("127.0.0.1", 5000), "headers": [(b"content-type", b"application/json"), *declared]}
        await app(scope, receive, send)
        runtime.close()
        xdb.close()
        return sent, served

    sent, served = asyncio.run(scenario())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]["code"] == "request_too_large"
    assert served == 3  # 3,000 bytes read of the limit's 2,500: the rest was never pulled


@pytest.mark.alone
@pytest.mark.process
def test_health_answers_while_a_big_codex_is_counted(served: tuple[TestClient, Runtime]) -> None:
    """Tokenizing a large Codex takes seconds; it happens off the event loop (in a child process past
    server/model/token_process.py's APART_CHARS), so the loop keeps answering /health meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    client, runtime = served
    # ~0.7 MB, a second of tokenizing.
    words = " ".join(f"w{i}" for i in range(100_000))
    body = {**chat(), "context": {"mode": "cag", "codex": [{"id": "big", "text": words}]}}
    latencies: list[float] = []
    # Once per server, the chat template is compiled and measured (tens of ms): not what is timed here.
    assert client.post("/v1/chat/completions", json={**chat(), "context": {}}).status_code == 200
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, "/v1/chat/completions", json=body)
        while not pending.done():
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
        response = pending.result()
    # Counted, then refused: a Codex this size cannot fit the tiny model's window in CAG mode.
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert len(latencies) > 10, latencies  # the request took long enough to be seen running
    # Under 0.1 s on an idle machine; a busy 2-core one adds stalls of its own scheduling, so the bound
    # catches the old stall on the loop (a second of tokenizing) rather than timing the machine.
    assert max(latencies) < 0.25, (max(latencies), len(latencies))
    assert runtime.orchestrator.counter.cached(f"# Codex\n\n## big\n{words}")


def test_the_prompt_budget_counts_the_chat_template_vllm_was_given(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With `--chat-template`, the orchestrator's count of the prompt is vLLM's count, preamble and all."""
    model_template = (Path(config.model) / "chat_template.jinja").read_text()
    template = tmp_path / "long.jinja"
    template.write_text("{{ 'A preamble the model template does not have. ' * 40 }}" + model_template)
    extra = [*config.engine.extra_args, "--chat-template", str(template)]
    with serving(config, vllm_config, tmp_path, **{"engine.extra_args": extra}) as (client, runtime):
        prepared = []
        prepare = runtime.orchestrator.prepare

        async def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            prepared.append(await prepare(*args, **kwargs))
            return prepared[-1]

        monkeypatch.setattr(runtime.orchestrator, "prepare", spy)
        response = client.post("/v1/chat/completions", json=chat("templated"))
        assert response.status_code == 200, response.text
        # The meter may overcount by a token a message boundary (its slack), never undercount.
        counted, actual = prepared[-1].prompt_tokens, response.json()["usage"]["prompt_tokens"]
        assert actual <= counted <= actual + 2 * len(prepared[-1].messages), (counted, actual)


@pytest.mark.slow
@pytest.mark.alone
def test_health_stays_fast_while_a_20_mb_codex_is_prepared(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path) -> None:
    """The largest Codex a request may carry: 20M characters, 16M tokens with the tiny model. The
    tokenizer holds the GIL while it builds and frees its result, which in-process stalled every other
    thread, /health included, for 0.5 to 2.5 s; the server counts such a text in a child process. What
    is left on the event loop is the body's JSON parse (~40 ms)."""
    chars = 1_990_000  # under rag_max_document_chars; ten of them under rag_max_total_chars
    words = " ".join(f"w{i}" for i in range(chars // 6))[:chars]
    codex = [{"id": f"d{i}", "text": f"{i} {words}"[:chars]} for i in range(10)]
    # Serialized up front: the test's own json.dumps of 20 MB would hold the GIL too.
    body = json.dumps({**chat(), "context": {"session_id": "big", "mode": "cag", "codex": codex}}).encode()
    with serving(config, vllm_config, tmp_path) as (client, runtime):
        assert runtime.token_process is not None
        # Once per server, the chat template is compiled and measured (tens of ms): not what is timed here.
        assert client.post("/v1/chat/completions", json={**chat(), "context": {}}).status_code == 200
        response, latencies = health_while_posting(client, "/v1/chat/completions", body)
        assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
        assert runtime.token_process.counted == 1  # the Codex was tokenized in the child
    assert len(latencies) > 100, latencies  # the request took long enough to be seen running
    # Measured: 60-70 ms at most on an idle machine, where the tokenizer in-process gave 0.5 s and more.
    # The bound leaves room for a busy one, whose scheduler adds stalls of its own.
    assert max(latencies) < 0.25, (f"/health took {max(latencies):.3f} s at worst while a 20 MB Codex was "
                                   f"prepared (median {sorted(latencies)[len(latencies) // 2]:.4f} s)")


@pytest.mark.parametrize("how", ["context", "header", "completions"])
def test_a_session_named_for_the_first_time_is_looked_up_off_the_event_loop(served: tuple[TestClient, Runtime],
                                                                            how: str) -> None:
    """Its last tick is a database read (a round trip to the XDB process); on the event loop it would stall
    every other request for as long as the database takes."""
    client, runtime = served
    on_loop: list[bool] = []
    ticks = runtime.xdb._ticks  # type: ignore[attr-defined]
    lookup = ticks._lookup

    def watched(session_id: str) -> int:
        on_loop.append(asyncio._get_running_loop() is not None)
        return lookup(session_id)

    ticks._lookup = watched
    session = f"first-time-{how}"
    if how == "context":
        done = client.post("/v1/chat/completions", json=chat(session))
    elif how == "header":
        done = client.post("/v1/chat/completions", json=chat(), headers={"X-Session-ID": session})
    else:
        done = client.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2},
                           headers={"X-Session-ID": session})
    assert done.status_code == 200, done.text
    assert on_loop and not any(on_loop), on_loop
