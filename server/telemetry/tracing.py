"""AHC's trace spans, in the same traces as vLLM's engine spans.

vLLM's `--otlp-traces-endpoint` (in `engine.extra_args`, or on `ahc serve`'s command line) turns both on.
AHC's modules make their spans through the OpenTelemetry API (`trace.get_tracer`), which stays a no-op
until a tracer provider is installed: without the endpoint none is, and a span costs next to nothing.

A chat request's span is the child of the client's `traceparent`, if it sent one; the prompt assembly,
admission, compaction, retrieval and recording spans nest under it, and the trace context handed to the
engine is the request span's, so vLLM's `llm_request` span is its child too. AHC's tracer provider is
the process's, installed before the engine starts: vLLM's spans go out through it, as service `ahc`
(unless the user names it) and without the usage the request span reports (server/telemetry/usage_once.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

if TYPE_CHECKING:  # the SDK is imported when tracing starts, not with this module
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)
# W3C trace context (`traceparent`, `tracestate`): the headers vLLM reads its trace context from.
PROPAGATOR = TraceContextTextMapPropagator()
SERVICE_NAME = "ahc"
# The GenAI conventions' switch for recording the conversation itself on spans; off unless set. The
# values after `true` are those of the conventions' newer instrumentations that include spans.
CAPTURE_MESSAGE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
CAPTURE_ON = ("true", "span_only", "span_and_event")
# What the OpenTelemetry API logs when a second tracer provider is installed: vLLM's engine, which
# tries to install its own as it starts, after AHC's.
REFUSED_PROVIDER = "Overriding of current TracerProvider is not allowed"


def start_tracing(endpoint: str | None) -> bool:
    """Install the process's tracer provider, sending every span to `endpoint` (the engine's
    `otlp_traces_endpoint`) over OTLP as vLLM would (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, gRPC by
    default); False when tracing is off. Called before the engine starts: vLLM's engine, finding a
    provider installed, keeps to it, so its spans go out with AHC's, under the same service name and
    without the usage AHC's request span reports (`UsageOnce`). A provider installed before (by a
    program embedding the server) is joined as it is."""
    if endpoint is None:
        return False
    name_the_service()
    from opentelemetry.sdk.trace import TracerProvider

    installed = trace.get_tracer_provider()
    if isinstance(installed, TracerProvider):
        if "vllm.instrumenting_module_name" in installed.resource.attributes:
            log.warning("vLLM's engine installed the tracer provider before AHC did: its spans repeat each "
                        "request's usage and keep vLLM's resource; start tracing before the engine")
        return True
    trace.set_tracer_provider(tracer_provider(endpoint))  # it sends the spans still batched as the process exits
    logging.getLogger("opentelemetry.trace").addFilter(_expected_refusal)
    return True


def tracer_provider(endpoint: str) -> TracerProvider:
    """AHC's tracer provider: its resource from the OTEL_* variables, its spans to `endpoint`."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from vllm.tracing.otel import get_span_exporter

    from server.telemetry.usage_once import UsageOnce

    exporter = get_span_exporter(endpoint)  # type: ignore[no-untyped-call]  # vLLM leaves it unannotated
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(UsageOnce(BatchSpanProcessor(exporter)))
    return provider


def name_the_service() -> None:
    """Name the service `ahc`, unless the user has (OTEL_SERVICE_NAME, or `service.name` in
    OTEL_RESOURCE_ATTRIBUTES). In the environment, where every tracer provider reads it: AHC's, and
    those the engine's own processes set up."""
    named = (pair.partition("=")[0].strip() for pair in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","))
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name" not in named:
        os.environ["OTEL_SERVICE_NAME"] = SERVICE_NAME


def records_content() -> bool:
    """Whether request spans record the conversation (`gen_ai.input.messages`, `gen_ai.output.messages`):
    only when the user opts in, with the GenAI conventions' switch."""
    return os.environ.get(CAPTURE_MESSAGE_CONTENT, "").strip().lower() in CAPTURE_ON


def start_request_span(headers: Mapping[str, str], name: str, attributes: Attributes) -> Span:
    """A request's span (not made current), the child of the trace context its headers carry."""
    return tracer.start_span(name, context=PROPAGATOR.extract(headers), kind=SpanKind.SERVER, attributes=attributes)


def engine_trace_headers(given: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """The trace context for the engine: the current span's when AHC is tracing it (so vLLM's span is
    its child), else what the caller gave (the client's own headers, as vLLM passes them)."""
    if not trace.get_current_span().is_recording():
        return given
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier


def _expected_refusal(record: logging.LogRecord) -> bool:
    """Drop the one warning that vLLM's engine was refused its own provider, which AHC's replaces on purpose."""
    return record.getMessage() != REFUSED_PROVIDER
