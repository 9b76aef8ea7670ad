"""AHC's trace spans and per-request log line on the fake-engine app: the spans, caught by an in-memory
exporter, nest under the request's span, which continues the client's `traceparent`, and the trace
context the engine is handed is that span's, so vLLM's own span joins the same trace."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fake_app import serving
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ahc.core.config import AHCConfig
from ahc.core.spans import CACHE_READ_INPUT_TOKENS, CONTEXT_MODE, INPUT_TOKENS, SESSION_ID
from bench.servers import start_server
from server.runtime import Runtime
from server.telemetry.tracing import engine_trace_headers, start_tracing

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


@pytest.fixture
def served(config: AHCConfig, vllm_config, tmp_path: Path) -> Iterator[tuple[TestClient, Runtime]]:  # type: ignore[no-untyped-def]
    with serving(config, vllm_config, tmp_path) as served:
        yield served


def chat(session: str, question: str = "What moves?", **extra: object) -> dict[str, object]:
    return {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": question}],
            "context": {"session_id": session, "identity": "You are a careful physicist."}, **extra}


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

    request = only(spans, "ahc.chat")
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
    assert assembled[SESSION_ID] == "s1" and assembled[INPUT_TOKENS] > 0
    assert (only(spans, "ahc.record.flush").attributes or {})[SESSION_ID] == "s1"


def test_without_a_traceparent_the_request_span_starts_the_trace(
        served: tuple[TestClient, Runtime], spans: InMemorySpanExporter) -> None:
    client, _ = served
    assert client.post("/v1/chat/completions", json=chat("s2")).status_code == 200
    request = only(spans, "ahc.chat")
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
    assert (only(spans, "ahc.chat").attributes or {})[CONTEXT_MODE] == "rag"


def test_each_chat_request_logs_one_line(served: tuple[TestClient, Runtime], caplog: pytest.LogCaptureFixture) -> None:
    client, runtime = served
    caplog.set_level(logging.INFO, logger="ahc.chat")
    client.post("/v1/chat/completions", json=chat("s5"))
    client.post("/v1/chat/completions", json=chat("s5", "And then?", stream=True))
    client.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": "hi"}]})
    lines = [r.getMessage() for r in caplog.records if r.name == "ahc.chat"]
    assert len(lines) == 3, lines
    prompts = [len(r.prompt_token_ids) for r in runtime.engine._engine.requests]
    assert lines[0] == (f"chat session=s5 mode=cag prompt_tokens={prompts[0]} cached_tokens=0 "
                        "first_changed_block=none governor=- outcome=committed")
    assert f"session=s5 mode=cag prompt_tokens={prompts[1]} cached_tokens=0 first_changed_block=state" in lines[1]
    assert " mode=passthrough " in lines[2] and lines[2].endswith("outcome=committed")


def test_a_refused_request_still_logs_its_line(served: tuple[TestClient, Runtime], caplog: pytest.LogCaptureFixture,
                                               spans: InMemorySpanExporter) -> None:
    client, _ = served
    caplog.set_level(logging.INFO, logger="ahc.chat")
    body = chat("s6")
    body["max_tokens"] = 10**6  # leaves no room for a prompt in the window: refused while preparing
    assert client.post("/v1/chat/completions", json=body).status_code == 400
    [line] = [r.getMessage() for r in caplog.records if r.name == "ahc.chat"]
    assert line == ("chat session=- mode=- prompt_tokens=- cached_tokens=- first_changed_block=- governor=- "
                    "outcome=InvalidRequest")
    request = only(spans, "ahc.chat")
    assert not request.status.is_ok and (request.attributes or {})["ahc.outcome"] == "InvalidRequest"


def test_the_engine_gets_the_callers_headers_when_nothing_is_traced() -> None:
    given = {"traceparent": TRACEPARENT}
    assert engine_trace_headers(given) is given  # no recording span is current here
    assert start_tracing(None) is False


def test_without_the_engines_tracer_provider_ahc_sets_up_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: list[object] = []
    monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)
    monkeypatch.setattr(trace, "set_tracer_provider", installed.append)
    monkeypatch.setattr("atexit.register", lambda *_: None)  # shut down here, not at the session's end
    assert start_tracing("http://127.0.0.1:4317") is True
    [provider] = installed
    assert isinstance(provider, TracerProvider)
    provider.shutdown()


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace collector in a thread: every span it is sent, by name."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CollectorHandler)
        self.spans: list[Any] = []  # opentelemetry.proto.trace.v1.trace_pb2.Span
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
def test_vllms_engine_span_is_a_child_of_ahcs_request_span(tmp_path: Path) -> None:
    """The real engine, `--otlp-traces-endpoint` on `ahc serve`'s command line, OTLP over HTTP to a
    collector in the test."""
    collector = Collector()
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    srv = start_server(tmp_path / "xdb", lens="off", extra=["--otlp-traces-endpoint", collector.endpoint], env=env)
    try:
        srv.client(default_headers={"traceparent": TRACEPARENT}).chat.completions.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}],
            extra_body={"context": {"session_id": "traced"}})
        spans = collector.wait_for("ahc.chat", "ahc.prompt.assemble", "ahc.record.flush", "llm_request")
    finally:
        srv.stop()
        collector.shutdown()
    request, engine = spans["ahc.chat"], spans["llm_request"]
    assert request.trace_id == engine.trace_id == CLIENT_TRACE.to_bytes(16, "big")
    assert request.parent_span_id == CLIENT_SPAN.to_bytes(8, "big")
    assert engine.parent_span_id == request.span_id  # vLLM's span is the child of AHC's
    assert spans["ahc.prompt.assemble"].parent_span_id == request.span_id
    attributes = {a.key: a.value for a in request.attributes}
    assert attributes[SESSION_ID].string_value == "traced"
    assert attributes[INPUT_TOKENS].int_value > 0 and attributes[CACHE_READ_INPUT_TOKENS].HasField("int_value")
