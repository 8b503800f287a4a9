"""The documented home of the dead-letter sinks (``jobbers_dead_letter_sink`` names
``jobbers_celery.sinks.RedisDeadLetterSink``); they live in :mod:`jobbers_celery.deadletter`."""

from __future__ import annotations

from jobbers_celery.deadletter.sinks import (
    BatchDeadLetterSink,
    DeadLetterSink,
    PayloadDeadLetterSink,
    RedisDeadLetterSink,
    SinkContext,
    SizedDeadLetterSink,
)

__all__ = [
    "BatchDeadLetterSink",
    "DeadLetterSink",
    "PayloadDeadLetterSink",
    "RedisDeadLetterSink",
    "SinkContext",
    "SizedDeadLetterSink",
]
