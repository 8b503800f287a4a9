"""Lifecycle storage: the only code that talks to Redis."""

from __future__ import annotations

from jobbers_celery.store.base import (
    CancelOutcome,
    Claimed,
    CleanerScan,
    Heartbeat,
    ResultWrite,
    StallVerdict,
    StepResult,
)
from jobbers_celery.store.keys import Keys
from jobbers_celery.store.redis import UNREACHABLE, Giver, RedisStore, WritesRefused, is_outage

__all__ = ["UNREACHABLE", "CancelOutcome", "Claimed", "CleanerScan", "Giver", "Heartbeat",
           "Keys", "RedisStore", "ResultWrite", "StallVerdict", "StepResult", "WritesRefused", "is_outage"]
