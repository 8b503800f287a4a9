"""Lifecycle storage: the only code that imports redis.

One sharded connection (:mod:`.sharded`) and one part per concern, each behind a Protocol
(:mod:`.parts`); :class:`RedisStore` is all of them.
"""

from __future__ import annotations

from jobbers_celery.store.base import (
    Alive,
    CancelOutcome,
    Claimed,
    CleanerScan,
    Giver,
    Halt,
    Heartbeat,
    ResultWrite,
    SentSteps,
    StallVerdict,
    StepResult,
    Submission,
)
from jobbers_celery.store.errors import (
    UNREACHABLE,
    StoreError,
    StoreValueError,
    WritesRefused,
    is_outage,
)
from jobbers_celery.store.keys import Keys
from jobbers_celery.store.parts import (
    AlertStore,
    CleanerStore,
    ClockStore,
    DeadLetterStore,
    HousekeepingStore,
    LayoutStore,
    MetricsStore,
    PacerStore,
    PauseStore,
    ReadStore,
    RunningStore,
    RunStore,
    SchedulerStore,
    SchedulingStore,
    StepStore,
    TaskStore,
)
from jobbers_celery.store.redis import RedisStore

__all__ = ["UNREACHABLE", "AlertStore", "Alive", "CancelOutcome", "Claimed", "CleanerScan",
           "CleanerStore",
           "ClockStore", "DeadLetterStore", "Giver", "Halt", "Heartbeat", "HousekeepingStore",
           "Keys", "LayoutStore", "MetricsStore", "PacerStore", "PauseStore", "ReadStore", "RedisStore",
           "ResultWrite", "RunStore", "RunningStore", "SchedulerStore", "SchedulingStore",
           "SentSteps", "StallVerdict", "StepResult", "StepStore", "StoreError", "StoreValueError",
           "Submission", "TaskStore", "WritesRefused", "is_outage"]
