"""AHC's trace spans and per-request log line on the fake-engine app: the spans, caught by an in-memory
exporter, nest under the request's span, which continues the client's `traceparent`, and the trace
context the engine is handed is that span's, so vLLM's own span joins the same trace."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from chat_bodies import chat
from fake_app import ALICE, serving
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.servers import start_server
from core.config import AHCConfig
from core.spans import (
    CACHE_READ_INPUT_TOKENS,
    CONTEXT_MODE,
    INPUT_MESSAGES,
    INPUT_TOKENS,
    LEGACY_USAGE,
    OPERATION_NAME,
    OUTPUT_MESSAGES,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    SESSION_ID,
)
from server.runtime import Runtime
from server.telemetry.tracing import (
    CAPTURE_MESSAGE_CONTENT,
    engine_trace_headers,
    name_the_service,
    start_tracing,
    tracer_provider,
)
from server.telemetry.usage_once import UsageOnce

CLIENT_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CLIENT_SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{CLIENT_TRACE:032x}-{CLIENT_SPAN:016x}-01"


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """Every span this process makes, from now on. The process's tracer provider can be set only once, so
    one already set is added to instead."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield memory
    memory.shutdown()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def only(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, [s.name for s in spans.get_finished_spans()]
    return found[0]


def children(spans: InMemorySpanExporter, parent: ReadableSpan) -> set[str]:
    return {s.name for s in spans.get_finished_spans() if s.parent is not None and s.parent.span_id == span_id(parent)}


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def engine_context(served: tuple[TestClient, Runtime]) -> tuple[int, int]:
    """(trace id, parent span id) of the trace context the engine got with its last request."""
    traceparent = served[1].engine._engine.requests[-1].kwargs["trace_headers"]["traceparent"]
    _, trace_id, parent_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(parent_id, 16)


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_request_is_one_trace_from_the_client_through_ahc_to_the_engine(
        served: tuple[TestClient, Runtime], spans: InMemorySpanExporter, stream: bool) -> None:
    client, runtime = served
    response = client.post("/v1/chat/completions", json=chat("s1", stream=stream),
                           headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200, response.text

    request = only(spans, "chat tiny")
    assert request.context is not None and request.context.trace_id == CLIENT_TRACE
    assert request.parent is not None and request.parent.span_id == CLIENT_SPAN  # the client's span
    # Assembly, admission and the flush that makes the reply durable (in the stream, after the route
    # returned) are all the request's children.
    assert {"ahc.prompt.assemble", "ahc.governor.admit", "ahc.record.flush"} <= children(spans, request)
    assert all(s.context is not None and s.context.trace_id == CLIENT_TRACE for s in spans.get_finished_spans())
    # vLLM makes its `llm_request` span from this context: a child of AHC's request span.
    assert engine_context(served) == (CLIENT_TRACE, span_id(request))

    prompt_ids = runtime.engine._engine.requests[-1].prompt_token_ids
    attributes = request.attributes or {}
    assert attributes[SESSION_ID] == "s1" and attributes[CONTEXT_MODE] == "cag"
    assert attributes[INPUT_TOKENS] == len(prompt_ids)  # the engine's count, not the orchestrator's
    assert attributes[CACHE_READ_INPUT_TOKENS] == 0  # the fake engine caches nothing
    assert attributes["ahc.outcome"] == "committed"
    # OpenTelemetry's GenAI conventions: what Langfuse and Phoenix group and count generations by
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "tiny"
    assert attributes["gen_ai.conversation.id"] == "s1"
    generated = attributes["gen_ai.usage.output_tokens"]
    assert generated > 0 and (stream or generated == response.json()["usage"]["completion_tokens"])
    assembled = only(spans, "ahc.prompt.assemble").attributes or {}
    assert assembled[SESSION_ID] == "s1" and assembled[PROMPT_TOKENS] > 0 and INPUT_TOKENS not in assembled
    # one flush: the reply's tokens and its turn record, committed together before the response ends
    flushes = [s for s in spans.get_finished_spans() if s.name == "ahc.record.flush"]
    assert len(flushes) == 1 and all((s.attributes or {})[SESSION_ID] == "s1" for s in flushes)


def test_the_request_span_is_a_genai_chat_with_the_requests_parameters_and_the_engines_response(
        served: tuple[TestClient, Runtime], spans: InMemorySpanExporter) -> None:
    client, _ = served
    sampling = {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "frequency_penalty": 0.25, "presence_penalty": 0.5,
                "seed": 7, "stop": "\n\n", "n": 2, "max_completion_tokens": 6}
    response = client.post("/v1/chat/completions", json=chat("s10", **sampling))
    assert response.status_code == 200, response.text
    body = response.json()

    attributes = only(spans, "chat tiny").attributes or {}  # `{operation} {model}`, as the conventions name it
    assert attributes["ahc.door"] == "chat" and attributes["ahc.tenant"] == "default"
    assert attributes[OPERATION_NAME] == "chat" and attributes["gen_ai.provider.name"] == "vllm"
    assert {key: attributes[f"gen_ai.request.{name}"] for key, name in [
        ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("seed", "seed"),
        ("frequency_penalty", "frequency_penalty"), ("presence_penalty", "presence_penalty"),
        ("max_completion_tokens", "max_tokens"), ("n", "choice.count")]} == {
        key: value for key, value in sampling.items() if key != "stop"}
    assert attributes["gen_ai.request.stop_sequences"] == ("\n\n",)
    assert attributes["gen_ai.response.id"] == body["id"] and attributes["gen_ai.response.model"] == body["model"]
    assert list(attributes["gen_ai.response.finish_reasons"]) == [c["finish_reason"] for c in body["choices"]]
    assert attributes[OUTPUT_TOKENS] == body["usage"]["completion_tokens"]  # both choices
    assert attributes[INPUT_TOKENS] == body["usage"]["prompt_tokens"]
    assert INPUT_MESSAGES not in attributes and OUTPUT_MESSAGES not in attributes  # never without the opt-in
    # The usage is on the request span alone (the assembly's own count is under its own span).
    assert [s.name for s in spans.get_finished_spans() if OUTPUT_TOKENS in (s.attributes or {})] == ["chat tiny"]


def test_a_request_without_sampling_fields_has_no_request_attributes_for_them(
        served: tuple[TestClient, Runtime], spans: InMemorySpanExporter) -> None:
    client, _ = served
    assert client.post("/v1/chat/completions", json={"model": "tiny", "messages": [
        {"role": "user", "content": "hi"}], "max_tokens": 4, "n": 1}).status_code == 200
    attributes = only(spans, "chat tiny").attributes or {}
    assert sorted(k for k in attributes if k.startswith("gen_ai.request.")) == [
        "gen_ai.request.max_tokens", "gen_ai.request.model"]  # no choice count for n=1


def test_the_messages_and_responses_doors_are_chat_spans_too(
        two_tenants: tuple[TestClient, Runtime], spans: InMemorySpanExporter) -> None:
    client, runtime = two_tenants
    key = {"Authorization": f"Bearer {ALICE}"}
    message = client.post("/v1/messages", headers=key, json={
        "model": "tiny", "max_tokens": 8, "stop_sequences": ["END"], "top_k": 3,
        "messages": [{"role": "user", "content": "hi"}]})
    assert message.status_code == 200, message.text
    response = client.post("/v1/responses", headers=key, json={
        "model": "tiny", "max_output_tokens": 8, "temperature": 0.0, "input": "hi", "store": False})
    assert response.status_code == 200, response.text

    doors = {(s.attributes or {})["ahc.door"]: s.attributes or {} for s in named(spans, "chat tiny")}
    assert set(doors) == {"messages", "responses"}
    tenant = runtime.keys.tenant_for(ALICE).name  # type: ignore[union-attr]
    assert all(a["ahc.tenant"] == tenant for a in doors.values()) and ALICE not in tenant
    messages, responses = doors["messages"], doors["responses"]
    assert messages["gen_ai.request.stop_sequences"] == ("END",) and messages["gen_ai.request.top_k"] == 3
    assert messages["gen_ai.request.max_tokens"] == 8 and messages["gen_ai.response.id"] == message.json()["id"]
    assert responses["gen_ai.request.max_tokens"] == 8 and responses["gen_ai.request.temperature"] == 0.0
    assert responses["gen_ai.response.id"] == response.json()["id"]
    assert all(a[OUTPUT_TOKENS] > 0 and a["gen_ai.response.finish_reasons"] for a in doors.values())


@pytest.mark.parametrize("stream", [False, True])
def test_the_conversation_is_on_the_span_only_when_the_user_opts_in(
        served: tuple[TestClient, Runtime], spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch,
        stream: bool) -> None:
    client, _ = served
    monkeypatch.setenv(CAPTURE_MESSAGE_CONTENT, "true")
    history = [{"role": "user", "content": "List the files"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "README.md"},
               {"role": "user", "content": [{"type": "text", "text": "Open it"}]}]
    response = client.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 8, "messages": history,
                                                          "stream": stream})
    assert response.status_code == 200, response.text
    if stream:
        choices = [json.loads(line[6:])["choices"] for line in response.text.splitlines() if line.startswith("data: {")]
        text = "".join(c[0]["delta"].get("content") or "" for c in choices if c)
        finish = next(c[0]["finish_reason"] for c in choices if c and c[0]["finish_reason"])
    else:
        choice = response.json()["choices"][0]
        text, finish = choice["message"]["content"], choice["finish_reason"]

    attributes = only(spans, "chat tiny").attributes or {}
    # The conventions' shape: a role and parts; tool calls and their results as parts of their own.
    assert json.loads(attributes[INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "List the files"}]},
        {"role": "assistant", "parts": [
            {"type": "tool_call", "id": "call_1", "name": "shell", "arguments": {"cmd": "ls"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "README.md"}]},
        {"role": "user", "parts": [{"type": "text", "content": "Open it"}]}]
    assert json.loads(attributes[OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": finish}]
    assert text


def test_vllms_engine_span_leaves_the_usage_to_ahcs_request_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own code makes the engine spans, as its output processor does for each finished request: the
    one under AHC's request span goes out without the usage, the one under a compaction keeps it."""
    from vllm.tracing import SpanAttributes, extract_trace_context, instrument_manual

    provider, memory = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(UsageOnce(SimpleSpanProcessor(memory)))
    monkeypatch.setattr(trace, "get_tracer", lambda name, *_, **__: provider.get_tracer(name))  # vLLM's, too
    ahc = provider.get_tracer("ahc")
    usage = {SpanAttributes.GEN_AI_USAGE_PROMPT_TOKENS: 12, SpanAttributes.GEN_AI_USAGE_COMPLETION_TOKENS: 3,
             SpanAttributes.GEN_AI_LATENCY_E2E: 0.5}

    def engine_span() -> None:
        context = extract_trace_context(engine_trace_headers(None))
        instrument_manual("llm_request", time.time_ns(), attributes=usage, context=context)

    request = ahc.start_span("chat tiny", attributes={OPERATION_NAME: "chat"})
    with trace.use_span(request, end_on_exit=True):
        with ahc.start_as_current_span("ahc.compaction"):
            engine_span()  # the summary call: no other span counts its tokens
        engine_span()
        request.set_attributes({INPUT_TOKENS: 12, OUTPUT_TOKENS: 3})
    summary, engine, _, _ = sorted(memory.get_finished_spans(), key=lambda s: s.name != "llm_request")
    assert summary.parent is not None and engine.parent is not None
    assert engine.parent.span_id == span_id(only(memory, "chat tiny"))
    assert set(LEGACY_USAGE) & set(engine.attributes or {}) == set()
    assert (engine.attributes or {})[SpanAttributes.GEN_AI_LATENCY_E2E] == 0.5  # the rest is vLLM's as it was
    assert {k: (summary.attributes or {})[k] for k in LEGACY_USAGE} == {k: usage[k] for k in LEGACY_USAGE}


def test_the_service_is_ahc_unless_the_user_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    unset(monkeypatch, "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")
    name_the_service()
    provider = tracer_provider("http://127.0.0.1:4318/v1/traces")
    assert provider.resource.attributes["service.name"] == "ahc"
    provider.shutdown()

    monkeypatch.setenv("OTEL_SERVICE_NAME", "mine")
    name_the_service()
    assert tracer_provider_service() == "mine"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test, service.name=theirs")
    name_the_service()
    assert "OTEL_SERVICE_NAME" not in os.environ and tracer_provider_service() == "theirs"


def tracer_provider_service() -> object:
    from opentelemetry.sdk.resources import Resource

    return Resource.create().attributes["service.name"]


def test_without_a_traceparent_the_request_span_starts_the_trace(
        served: tuple[TestClient, Runtime], spans: InMemorySpanExporter) -> None:
    client, _ = served
    assert client.post("/v1/chat/completions", json=chat("s2")).status_code == 200
    request = only(spans, "chat tiny")
    assert request.parent is None
    assert engine_context(served) == (request.context.trace_id, span_id(request))  # type: ignore[union-attr]


def test_compaction_and_its_summary_call_nest_under_the_prompt_assembly(
        config: AHCConfig, vllm_config, tmp_path: Path, spans: InMemorySpanExporter) -> None:  # type: ignore[no-untyped-def]
    overrides = {"orchestrator.compaction_threshold_tokens": 1, "orchestrator.compaction_keep_turns": 0}
    with serving(config, vllm_config, tmp_path, **overrides) as (client, runtime):
        assert client.post("/v1/chat/completions", json=chat("s3")).status_code == 200
        spans.clear()
        assert client.post("/v1/chat/completions", json=chat("s3", "And then?")).status_code == 200
        summary_call = next(r for r in runtime.engine._engine.requests if r.request_id.startswith("ahc-hidden-"))
    compaction = only(spans, "ahc.compaction")
    assert compaction.parent is not None and compaction.parent.span_id == span_id(only(spans, "ahc.prompt.assemble"))
    assert (compaction.attributes or {})[SESSION_ID] == "s3"
    # The summary's engine request carries the compaction's trace context.
    parent = summary_call.kwargs["trace_headers"]["traceparent"].split("-")[2]
    assert int(parent, 16) == span_id(compaction)


def test_a_rag_request_traces_its_retrieval(served: tuple[TestClient, Runtime], spans: InMemorySpanExporter) -> None:
    client, _ = served
    body = chat("s4", "Where do the particles go?")
    body["context"] = {**body["context"], "mode": "rag",  # type: ignore[dict-item]
                       "codex": [{"id": "physics", "text": "The particles move right, then left. " * 20}]}
    assert client.post("/v1/chat/completions", json=body).status_code == 200, body
    retrieval = only(spans, "ahc.retrieval")
    assert retrieval.parent is not None and retrieval.parent.span_id == span_id(only(spans, "ahc.prompt.assemble"))
    assert (retrieval.attributes or {})["ahc.retrieval.excerpts"] >= 1
    assert (only(spans, "chat tiny").attributes or {})[CONTEXT_MODE] == "rag"


def test_each_chat_request_logs_one_line(served: tuple[TestClient, Runtime], caplog: pytest.LogCaptureFixture) -> None:
    client, runtime = served
    caplog.set_level(logging.INFO, logger="ahc.requests")
    client.post("/v1/chat/completions", json=chat("s5"))
    client.post("/v1/chat/completions", json=chat("s5", "And then?", stream=True))
    client.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": "hi"}]})
    lines = [r.getMessage() for r in caplog.records if r.name == "ahc.requests"]
    assert len(lines) == 3, lines
    prompts = [len(r.prompt_token_ids) for r in runtime.engine._engine.requests]
    assert lines[0] == (f"chat session=s5 mode=cag prompt_tokens={prompts[0]} cached_tokens=0 "
                        "first_changed_block=none governor=- outcome=committed")
    assert f"session=s5 mode=cag prompt_tokens={prompts[1]} cached_tokens=0 first_changed_block=state" in lines[1]
    assert " mode=passthrough " in lines[2] and lines[2].endswith("outcome=committed")


def test_a_refused_request_still_logs_its_line(served: tuple[TestClient, Runtime], caplog: pytest.LogCaptureFixture,
                                               spans: InMemorySpanExporter) -> None:
    client, _ = served
    caplog.set_level(logging.INFO, logger="ahc.requests")
    body = chat("s6")
    body["max_tokens"] = 10**6  # leaves no room for a prompt in the window: refused while preparing
    assert client.post("/v1/chat/completions", json=body).status_code == 400
    [line] = [r.getMessage() for r in caplog.records if r.name == "ahc.requests"]
    assert line == ("chat session=- mode=- prompt_tokens=- cached_tokens=- first_changed_block=- governor=- "
                    "outcome=InvalidRequest")
    request = only(spans, "chat tiny")
    assert not request.status.is_ok and (request.attributes or {})["ahc.outcome"] == "InvalidRequest"


def test_the_engine_gets_the_callers_headers_when_nothing_is_traced() -> None:
    given = {"traceparent": TRACEPARENT}
    assert engine_trace_headers(given) is given  # no recording span is current here
    assert start_tracing(None) is False


def test_without_a_tracer_provider_ahc_installs_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    unset(monkeypatch, "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")
    installed: list[object] = []
    monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)
    monkeypatch.setattr(trace, "set_tracer_provider", installed.append)
    monkeypatch.setattr("atexit.register", lambda *_: None)  # shut down here, not at the session's end
    assert start_tracing("http://127.0.0.1:4317") is True
    [provider] = installed
    assert isinstance(provider, TracerProvider) and provider.resource.attributes["service.name"] == "ahc"
    assert os.environ["OTEL_SERVICE_NAME"] == "ahc"  # where the engine's own processes read it too
    provider.shutdown()


def unset(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Unset `names` for the test, and unset again after it, whatever the code under test sets."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace collector in a thread: every span it is sent, by name, and the services that
    sent them."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CollectorHandler)
        self.spans: list[Any] = []  # opentelemetry.proto.trace.v1.trace_pb2.Span
        self.services: set[str] = set()  # each resource's service.name
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def wait_for(self, *names: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {s.name: s for s in self.spans}
            if all(name in found for name in names):
                return found
            time.sleep(0.2)
        raise AssertionError(f"spans {names} not all received: {sorted({s.name for s in self.spans})}")


class _CollectorHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802  # http.server's name
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
        assert isinstance(self.server, Collector)
        self.server.spans += [s for r in request.resource_spans for scope in r.scope_spans for s in scope.spans]
        self.server.services |= {a.value.string_value for r in request.resource_spans for a in r.resource.attributes
                                 if a.key == "service.name"}
        body = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # http.server's signature
        """Quiet: the test reads the spans, not the access log."""


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("content", [False, True], ids=["default", "content"])
def test_an_otlp_receiver_gets_ahcs_request_span_with_vllms_engine_span_as_its_child(
        tmp_path: Path, content: bool) -> None:
    """The real engine, `--otlp-traces-endpoint` on `ahc serve`'s command line, OTLP over HTTP to a
    collector in the test: what Langfuse or Phoenix would be sent."""
    collector = Collector()
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200",
           "OTEL_SERVICE_NAME": "", "OTEL_RESOURCE_ATTRIBUTES": "", CAPTURE_MESSAGE_CONTENT: str(content).lower()}
    srv = start_server(tmp_path / "xdb", lens="off", extra=["--otlp-traces-endpoint", collector.endpoint], env=env)
    try:
        reply = srv.client(default_headers={"traceparent": TRACEPARENT}).chat.completions.create(
            model="tiny", max_tokens=2, temperature=0.5, top_p=0.9, seed=7, stop=["STOP"],
            messages=[{"role": "user", "content": "hi"}], extra_body={"context": {"session_id": "traced"}})
        spans = collector.wait_for("chat tiny", "ahc.prompt.assemble", "ahc.record.flush", "llm_request")
    finally:
        srv.stop()
        collector.shutdown()
    request, engine = spans["chat tiny"], spans["llm_request"]
    assert collector.services == {"ahc"}  # vLLM's spans went out with AHC's, under its resource
    assert request.trace_id == engine.trace_id == CLIENT_TRACE.to_bytes(16, "big")
    assert request.parent_span_id == CLIENT_SPAN.to_bytes(8, "big")
    assert engine.parent_span_id == request.span_id  # vLLM's span is the child of AHC's
    assert spans["ahc.prompt.assemble"].parent_span_id == request.span_id

    attributes = {a.key: a.value for a in request.attributes}
    assert attributes[SESSION_ID].string_value == "traced"
    assert attributes[OPERATION_NAME].string_value == "chat" and attributes["ahc.door"].string_value == "chat"
    assert attributes["gen_ai.request.temperature"].double_value == 0.5
    assert attributes["gen_ai.request.top_p"].double_value == 0.9 and attributes["gen_ai.request.seed"].int_value == 7
    assert attributes["gen_ai.request.max_tokens"].int_value == 2
    assert [v.string_value for v in attributes["gen_ai.request.stop_sequences"].array_value.values] == ["STOP"]
    assert attributes["gen_ai.response.id"].string_value == reply.id
    assert attributes["gen_ai.response.model"].string_value == reply.model
    assert [v.string_value for v in attributes["gen_ai.response.finish_reasons"].array_value.values] == [
        reply.choices[0].finish_reason]
    # The usage once: on AHC's span, as the engine counted it; vLLM's span without its own count of it.
    assert reply.usage is not None
    assert attributes[INPUT_TOKENS].int_value == reply.usage.prompt_tokens
    assert attributes[OUTPUT_TOKENS].int_value == reply.usage.completion_tokens
    assert attributes[CACHE_READ_INPUT_TOKENS].HasField("int_value")
    engine_keys = {a.key for a in engine.attributes}
    assert "gen_ai.latency.e2e" in engine_keys and not engine_keys & {*LEGACY_USAGE, INPUT_TOKENS, OUTPUT_TOKENS}

    recorded = {key for s in collector.spans for key in (a.key for a in s.attributes)}
    if not content:
        assert not recorded & {INPUT_MESSAGES, OUTPUT_MESSAGES}  # never without the opt-in
        return
    assert json.loads(attributes[INPUT_MESSAGES].string_value)[-1] == {
        "role": "user", "parts": [{"type": "text", "content": "hi"}]}
    assert json.loads(attributes[OUTPUT_MESSAGES].string_value) == [
        {"role": "assistant", "parts": [{"type": "text", "content": reply.choices[0].message.content}],
         "finish_reason": reply.choices[0].finish_reason}]
