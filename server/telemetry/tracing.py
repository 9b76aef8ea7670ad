"""AHC's trace spans, in the same traces as vLLM's engine spans.

vLLM's `--otlp-traces-endpoint` (in `engine.extra_args`, or on `ahc serve`'s command line) turns both on.
AHC's modules make their spans through the OpenTelemetry API (`trace.get_tracer`), which stays a no-op
until a tracer provider is installed: without the endpoint none is, and a span costs next to nothing.

A chat request's span is the child of the client's `traceparent`, if it sent one; the prompt assembly,
admission, compaction, retrieval and recording spans nest under it, and the trace context handed to the
engine is the request span's, so vLLM's `llm_request` span is its child too.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

tracer = trace.get_tracer(__name__)
# W3C trace context (`traceparent`, `tracestate`): the headers vLLM reads its trace context from.
PROPAGATOR = TraceContextTextMapPropagator()


def start_tracing(endpoint: str | None) -> bool:
    """Send AHC's spans to `endpoint` (the engine's `otlp_traces_endpoint`) once the engine has started;
    False when tracing is off. vLLM's engine installs the process's tracer provider as it starts with an
    endpoint, and AHC's spans join that one; if none is there, one is set up the way vLLM sets up its own
    (OTLP over OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, gRPC by default)."""
    if endpoint is None:
        return False
    from opentelemetry.sdk.trace import TracerProvider

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return True
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from vllm.tracing.otel import get_span_exporter

    exporter = get_span_exporter(endpoint)  # type: ignore[no-untyped-call]  # vLLM leaves it unannotated
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # it sends the spans still batched as the process exits
    return True


def start_request_span(name: str, headers: Mapping[str, str]) -> Span:
    """A request's span (not made current), the child of the trace context its headers carry."""
    return tracer.start_span(name, context=PROPAGATOR.extract(headers), kind=SpanKind.SERVER)


def engine_trace_headers(given: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """The trace context for the engine: the current span's when AHC is tracing it (so vLLM's span is
    its child), else what the caller gave (the client's own headers, as vLLM passes them)."""
    if not trace.get_current_span().is_recording():
        return given
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier
