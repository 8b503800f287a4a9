"""The Resubmitter on the in-memory store (jobbers_celery.testing), no Redis, no worker: a
dead letter goes back to ``submitted`` and out to the broker once however many ask, an entry
that cannot be published is left as it is, and "current" refuses an unregistered task before
anything changes. The real-Redis paths: tests/integration/test_lifecycle.py,
test_resubmit_versions.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish

from jobbers_celery import UNPUBLISHABLE, DeadLetter, Jobbers, TaskState
from jobbers_celery.testing import InMemoryStore, in_memory


def entry(task_id: str, **over: Any) -> DeadLetter:
    values: dict[str, Any] = {
        "task_id": task_id, "name": "unit.flaky", "version": None, "queue": "celery",
        "reason": "failed", "args": [1], "kwargs": {"k": "v"}, "exception_type": None,
        "exception_message": None, "traceback": None, "attempt": 1, "retry_attempt": 0,
        "worker": None, "failed_at": datetime(2026, 1, 1, tzinfo=UTC), "checkpoint": None,
        "options": {"queue": "celery", "headers": {"jobbers_enqueued_at": 5}}}
    values.update(over)
    return DeadLetter(**values)


@pytest.fixture
def jobbers() -> Jobbers:
    return in_memory(Celery("resubmit_unit", broker="memory://", set_as_current=False),
                     InMemoryStore())


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.append(dict(headers or {}))

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


def test_a_dead_letter_goes_out_once_however_many_ask(jobbers: Jobbers,
                                                      published: list[dict[str, Any]]) -> None:
    dead = entry("t1")
    assert jobbers.resubmit_dead_letters([dead, dead]) == ["t1"]
    assert jobbers.resubmit_dead_letters([dead]) == []  # submitted now: not resubmittable
    assert [h["id"] for h in published] == ["t1"]
    # a new run: its first enqueue is now, not the entry's
    assert published[0].get("jobbers_enqueued_at") != 5
    record = jobbers.get("t1")
    assert record is not None
    assert record.state is TaskState.SUBMITTED


def test_an_entry_that_cannot_be_published_is_left_as_it_is(
        jobbers: Jobbers, published: list[dict[str, Any]]) -> None:
    raw = entry("t2", options={"queue": "celery", UNPUBLISHABLE: "not JSON"})
    assert jobbers.resubmit_dead_letters([raw]) == []
    assert published == []
    assert jobbers.get("t2") is None


def test_current_refuses_an_unregistered_task_before_anything_changes(
        jobbers: Jobbers, published: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match=r"unit\.flaky is not registered as a JobbersTask"):
        jobbers.resubmit_dead_letters([entry("t3")], version="current")
    assert published == []
    assert jobbers.get("t3") is None
