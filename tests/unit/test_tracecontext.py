"""The writer's span as a W3C `traceparent` (outbox/tracecontext.py), alone."""

from __future__ import annotations

import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from outbox import tracecontext

W3C = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@given(
    trace_id=st.integers(1, 2**128 - 1),
    span_id=st.integers(1, 2**64 - 1),
    flags=st.integers(0, 255),
)
def test_any_valid_span_is_written_as_w3c_reads_it(trace_id: int, span_id: int, flags: int) -> None:
    span = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags)))
    with trace.use_span(span):
        found = tracecontext.current()
    assert found is not None
    parsed = W3C.fullmatch(found)
    assert parsed is not None, found
    assert [int(g, 16) for g in parsed.groups()] == [trace_id, span_id, flags]


def test_no_span_no_header() -> None:
    assert tracecontext.current() is None


def test_without_opentelemetry_nothing_is_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails, as where it is not installed
    assert tracecontext.current() is None
