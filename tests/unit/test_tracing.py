"""The trace context a task's payload carries, and the republishes run inside it
(jobbers_celery.telemetry.tracing). The SDK's tracer is a private one: the process's global provider
is left alone."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from jobbers_celery.telemetry import tracing
from tests.unit.test_metrics import blocking, run_python

TRACER = TracerProvider().get_tracer("tests")


def _trace_id() -> int:
    return trace.get_current_span().get_span_context().trace_id


def test_stamp_writes_the_current_span_and_nothing_outside_one():
    headers: dict[str, Any] = {"x": 1}
    tracing.stamp(headers)
    assert headers == {"x": 1}
    with TRACER.start_as_current_span("client") as span:
        tracing.stamp(headers)
    ctx = span.get_span_context()
    assert headers["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    assert headers["x"] == 1


def test_a_republish_runs_inside_the_carried_context_then_leaves_it():
    with TRACER.start_as_current_span("client") as span:
        headers: dict[str, Any] = {}
        tracing.stamp(headers)
    assert _trace_id() == 0
    with tracing.inside(headers):
        assert _trace_id() == span.get_span_context().trace_id
        # what the instrumentation's apply_async span would have as parent
        with TRACER.start_as_current_span("apply_async") as child:
            pass
    assert child.parent is not None
    assert child.parent.span_id == span.get_span_context().span_id
    assert _trace_id() == 0


def test_a_span_of_the_same_trace_stays_current():
    """A retry published by its running attempt: its own span is the better parent."""
    with TRACER.start_as_current_span("client"):
        headers: dict[str, Any] = {}
        tracing.stamp(headers)
        with TRACER.start_as_current_span("run") as run, tracing.inside(headers):
            assert trace.get_current_span() is run


def test_headers_without_a_context_change_nothing():
    for headers in (None, {}, {"traceparent": ""}, {"traceparent": "garbage"}):
        with tracing.inside(headers):
            assert _trace_id() == 0


def test_without_opentelemetry_api_headers_pass_through():
    out = run_python(blocking("opentelemetry") + (
        "from jobbers_celery.telemetry import tracing\n"
        "h = {'traceparent': '00-' + '1' * 32 + '-' + '2' * 16 + '-01'}\n"
        "before = dict(h)\n"
        "tracing.stamp(h)\n"
        "with tracing.inside(h):\n"
        "    pass\n"
        "print(h == before, [m for m in sys.modules if m.startswith('opentelemetry')])\n"))
    assert out == "True []"
