"""Helpers shared by the end-to-end lifecycle tests (real workers, real Redis)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from jobbers_celery import DeadLetter, TaskRecord, TaskState, Transition

S = TaskState

#: The pools the important paths run on: a forked child per task, and threads in one process.
POOLS = ["prefork", "threads"]


def wait_state(jobbers: Any, task_id: str, *states: TaskState, timeout: float = 20.0,
               worker: Any = None) -> TaskRecord:
    """Poll the record until it is in one of ``states``; fail with its last state and history
    (and the tail of ``worker``'s log when given)."""
    wanted = set(states)
    deadline = time.monotonic() + timeout
    record = None
    while True:
        record = jobbers.get(task_id)
        if record is not None and record.state in wanted:
            return record
        if time.monotonic() > deadline:
            raise AssertionError(
                f"task {task_id} not in {sorted(wanted)} after {timeout}s: it is "
                f"{record.state if record else 'unknown'}; history {path(jobbers, task_id)}"
                + (f"\nworker log:\n{worker.log[-6000:]}" if worker is not None else "")
            )
        time.sleep(0.02)


def path(jobbers: Any, task_id: str) -> list[tuple[str, str]]:
    return [(t.from_state.value, t.to_state.value) for t in jobbers.history(task_id)]


def transitions(jobbers: Any, task_id: str, to: TaskState) -> list[Transition]:
    return [t for t in jobbers.history(task_id) if t.to_state == to]


def dead_letters(jobbers: Any, task_id: str) -> list[DeadLetter]:
    return [e for e in jobbers.sink.entries(limit=1000) if e.task_id == task_id]


def ms(value: datetime | None) -> int:
    assert value is not None
    return round(value.timestamp() * 1000)


def assert_utc(*values: datetime | None) -> None:
    for value in values:
        assert value is not None
        assert value.tzinfo == UTC, value
        assert value.utcoffset() == timedelta(0), value


def unique(prefix: str) -> str:
    return f"proj:{prefix}:{uuid.uuid4().hex[:10]}"


# The lifecycle paths of the state machine (docs/reference/lifecycle.md), as (from, to) pairs.
PUBLISH = [(S.UNSUBMITTED.value, S.SUBMITTED.value)]
START = [(S.SUBMITTED.value, S.STARTED.value)]
IMMEDIATE_RETRY = [(S.STARTED.value, S.UNSUBMITTED.value), *PUBLISH, *START]
DELAYED_RETRY = [(S.STARTED.value, S.SCHEDULED.value), (S.SCHEDULED.value, S.SUBMITTED.value),
                 *START]
COMPLETE = [(S.STARTED.value, S.COMPLETED.value)]
FAIL = [(S.STARTED.value, S.FAILED.value)]
