"""Each generation's token usage once in a trace, on AHC's request span.

vLLM's engine span (`llm_request`), a child of AHC's request span, counts the same prompt and reply
under the GenAI conventions' older names (`gen_ai.usage.prompt_tokens`, `..._completion_tokens`).
Backends that read both names (Langfuse, Phoenix) would count every request's tokens twice, so the
engine span goes out without them. An engine span under any other span (a compaction's summary call)
keeps its usage: nothing else reports it.
"""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from core.spans import LEGACY_USAGE, OPERATION_NAME


class UsageOnce(SpanProcessor):
    """Hands every span to `processor` (the one that exports them), a GenAI operation's child without
    the usage it repeats. A GenAI operation span is one started with `gen_ai.operation.name`: its
    children end before it does, so it is known while they end."""

    def __init__(self, processor: SpanProcessor) -> None:
        self._processor = processor
        self._operations: set[int] = set()  # the span ids of the GenAI operation spans not ended yet

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if span.attributes is not None and OPERATION_NAME in span.attributes:
            self._operations.add(span.get_span_context().span_id)
        self._processor.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None:
            self._operations.discard(span.context.span_id)
        if span.parent is not None and span.parent.span_id in self._operations:
            span = without(span, LEGACY_USAGE)
        self._processor.on_end(span)

    def shutdown(self) -> None:
        self._processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._processor.force_flush(timeout_millis)


def without(span: ReadableSpan, names: tuple[str, ...]) -> ReadableSpan:
    """`span` less the attributes `names` (the span itself when it has none of them)."""
    attributes = span.attributes or {}
    if not any(name in attributes for name in names):
        return span
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource,
        attributes={key: value for key, value in attributes.items() if key not in names},
        events=span.events, links=span.links, kind=span.kind, status=span.status, start_time=span.start_time,
        end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)
