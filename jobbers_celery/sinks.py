"""The documented home of the dead-letter sinks (``jobbers_dead_letter_sink`` names
``jobbers_celery.sinks.RedisDeadLetterSink``); they live in :mod:`jobbers_celery.deadletter`
(:mod:`~jobbers_celery.deadletter.sink`, :mod:`~jobbers_celery.deadletter.redis_sink`)."""

from __future__ import annotations

from jobbers_celery.deadletter.redis_sink import RedisDeadLetterSink
from jobbers_celery.deadletter.sink import (
    BatchDeadLetterSink,
    DeadLetterSink,
    PayloadDeadLetterSink,
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
