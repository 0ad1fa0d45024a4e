"""W3C trace context for outbox events: the writer's current span as a `traceparent` header.

With `opentelemetry-api` installed (`pip install 'outbox-eos[tracing]'`) and a
span current where an event is written, the event carries that span's
`traceparent` (https://www.w3.org/TR/trace-context/), which the relay passes on
to Kafka unchanged, as OpenTelemetry's Kafka instrumentations read it. No
OpenTelemetry, or no span: nothing is added.
"""

from __future__ import annotations

__all__ = ["HEADER", "current"]

HEADER = "traceparent"


def current() -> str | None:
    """The current span's traceparent; None without OpenTelemetry or a valid current span."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
