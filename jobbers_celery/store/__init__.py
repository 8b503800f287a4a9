"""Lifecycle storage: the only code that talks to Redis."""

from __future__ import annotations

from jobbers_celery.store.base import Claimed, Heartbeat, ResultWrite, StepResult
from jobbers_celery.store.keys import Keys
from jobbers_celery.store.redis import UNREACHABLE, RedisStore, WritesRefused, is_outage

__all__ = ["UNREACHABLE", "Claimed", "Heartbeat", "Keys", "RedisStore", "ResultWrite",
           "StepResult", "WritesRefused", "is_outage"]
