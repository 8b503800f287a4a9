"""Trace context that travels with a task, so that all its attempts are one trace.

A republish (a delayed retry the scheduler publishes, a stall recovery, a shutdown
resubmit, a dead-letter resubmit) happens in another thread or process than the publish
that made the task, outside any span: without help, ``opentelemetry-instrumentation-celery``
starts a new trace for it there. So the W3C trace context (``traceparent``,
``tracestate``: whatever fields the global propagator writes) is kept in the headers of the
payload stored on the record (:func:`stamp`), and every republish runs inside it
(:func:`inside`): the instrumentation's ``apply_async`` span, where the SDK is set up,
continues the trace, and the message carries the context in its headers anyway, so that a
pool child with the SDK continues it even when the process that republishes has none.

Through ``opentelemetry-api`` only (the ``otel`` extra). Without it nothing is injected or
attached: the headers a payload already carries go out as they are.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # the otel extra is not installed: headers pass through unchanged
    _context = None  # type: ignore[assignment]
    _propagate = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]

__all__ = ["TRACEPARENT", "inside", "stamp"]

#: The W3C header that names the span a message was published in.
TRACEPARENT = "traceparent"


def _current_trace_id() -> int | None:
    """The trace id of the span current in this thread, ``None`` outside any."""
    assert _trace is not None
    span_context = _trace.get_current_span().get_span_context()
    return span_context.trace_id if span_context.is_valid else None


def stamp(headers: MutableMapping[str, Any]) -> None:
    """Write the current trace context into ``headers`` (a payload's, or a message's
    before it is recorded), if a span is current; else keep what they carry (the context a
    running attempt received, or none)."""
    if _propagate is None or _current_trace_id() is None:
        return
    _propagate.inject(headers)


@contextmanager
def inside(headers: MutableMapping[str, Any] | None) -> Iterator[None]:
    """Run a republish inside the trace context ``headers`` carry, unless a span of that
    trace is already current (a retry published by its running attempt)."""
    if _propagate is None or not headers or not headers.get(TRACEPARENT):
        yield
        return
    carried = _propagate.extract(headers)
    wanted = _trace.get_current_span(carried).get_span_context()
    if not wanted.is_valid or _current_trace_id() == wanted.trace_id:
        yield
        return
    token = _context.attach(carried)
    try:
        yield
    finally:
        _context.detach(token)
