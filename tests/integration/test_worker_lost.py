"""A prefork pool process SIGKILLed while it runs a task with ``acks_late``: plain Celery and
jobbers, the same task code (``tests.integration.ending_proj``, its body kills its process
the first time it runs).

- ``reject_on_worker_lost``: plain Celery requeues the message and runs the task again;
  jobbers too by default (``on_worker_lost`` follows Celery), the record saying
  ``started -> unsubmitted -> submitted`` with the lost worker, then the next attempt.
- ``on_worker_lost="fail"``: the message is not requeued (even with
  ``reject_on_worker_lost``): FAILURE (``WorkerLostError``) for the caller, ``failed`` in the
  record, a dead letter.
- ``acks_late`` alone: Celery stores FAILURE; jobbers the same (``failed``), and
  ``on_worker_lost="rerun"`` runs it again instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from billiard.exceptions import WorkerLostError

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.ending_helpers import Setup, setups
from tests.integration.lifecycle_helpers import dead_letters, path, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
PUBLISHED = [("unsubmitted", "submitted"), ("submitted", "started")]
REQUEUED = [("started", "unsubmitted"), ("unsubmitted", "submitted"), ("submitted", "started"),
            ("started", "completed")]


@pytest.fixture
def setup(redis_url: str, tmp_path: Path) -> Iterator[Setup]:
    with setups(redis_url, tmp_path, lambda: "") as make:
        yield make("same redis")


@pytest.fixture
def worker(setup: Setup, tmp_path: Path) -> Iterator[Any]:
    started = setup.worker(tmp_path, ENDING_PROJ_KILL="in_body")
    yield started
    started.kill()


def outcome(result: Any) -> tuple[str, Any]:
    """What the caller gets: ("value", v) or ("raises", exception type name)."""
    try:
        return "value", result.get(timeout=30)
    except Exception as exc:  # noqa: BLE001 - the outcome is what was raised
        return "raises", type(exc).__name__


def test_requeued_copy_runs_again_as_in_celery(setup, worker):
    plain = setup.task("plain_lost_requeued").delay(0.1)
    tracked = setup.task("jobbers_lost_requeued").delay(0.1)
    assert outcome(plain) == outcome(tracked) == ("value", "done")
    assert setup.runs(plain.id) == setup.runs(tracked.id) == 2
    record = wait_state(setup.jobbers, tracked.id, S.COMPLETED, worker=worker)
    assert record.attempt == 2
    assert path(setup.jobbers, tracked.id) == PUBLISHED + REQUEUED
    [lost] = [t for t in setup.jobbers.history(tracked.id) if t.to_state is S.UNSUBMITTED]
    assert lost.attempt == 1
    assert lost.reason.startswith("its worker process was lost (WorkerLostError: Worker "
                                  "exited prematurely: signal 9 (SIGKILL)")
    assert lost.reason.endswith("; the message goes back to the broker to run again")
    assert dead_letters(setup.jobbers, tracked.id) == []
    assert "refused transition" not in worker.log


def test_on_worker_lost_fail_refuses_the_requeue_and_dead_letters(setup, worker):
    refused = setup.task("jobbers_lost_refused").delay(0.1)
    assert outcome(refused) == ("raises", "WorkerLostError")
    assert refused.state == "FAILURE"
    record = wait_state(setup.jobbers, refused.id, S.FAILED, worker=worker)
    assert record.attempt == 1
    assert record.error is not None
    assert record.error.type == "billiard.exceptions.WorkerLostError"
    assert path(setup.jobbers, refused.id) == [*PUBLISHED, ("started", "failed")]
    [entry] = wait_for(lambda: dead_letters(setup.jobbers, refused.id), timeout=5,
                       message="the dead letter")
    assert entry.exception_type == "billiard.exceptions.WorkerLostError"
    # the message was acknowledged, not requeued: it never runs again
    assert setup.runs(refused.id) == 1
    assert isinstance(refused.result, WorkerLostError)


def test_acked_message_fails_as_in_celery_unless_on_worker_lost_reruns(setup, worker):
    plain = setup.task("plain_lost_acked").delay(0.1)
    tracked = setup.task("jobbers_lost_acked").delay(0.1)
    assert outcome(plain) == outcome(tracked) == ("raises", "WorkerLostError")
    assert setup.runs(plain.id) == setup.runs(tracked.id) == 1
    record = wait_state(setup.jobbers, tracked.id, S.FAILED, worker=worker)
    assert record.error is not None
    assert record.error.type == "billiard.exceptions.WorkerLostError"
    wait_for(lambda: dead_letters(setup.jobbers, tracked.id), timeout=5,
             message="the dead letter")

    rerun = setup.task("jobbers_lost_rerun").delay(0.1)
    assert outcome(rerun) == ("value", "done")
    assert setup.runs(rerun.id) == 2
    record = wait_state(setup.jobbers, rerun.id, S.COMPLETED, worker=worker)
    assert record.attempt == 2
    assert path(setup.jobbers, rerun.id) == PUBLISHED + REQUEUED
    assert dead_letters(setup.jobbers, rerun.id) == []


def test_reject_with_requeue_runs_again_and_records_the_requeue(setup, worker):
    plain = setup.task("plain_rejected").delay()
    tracked = setup.task("jobbers_rejected").delay()
    assert outcome(plain) == outcome(tracked) == ("value", "done")
    assert setup.runs(plain.id) == setup.runs(tracked.id) == 2
    record = wait_state(setup.jobbers, tracked.id, S.COMPLETED, worker=worker)
    assert record.attempt == 2
    assert path(setup.jobbers, tracked.id) == PUBLISHED + REQUEUED
    reasons = [t.reason for t in setup.jobbers.history(tracked.id)]
    assert reasons[2:4] == ["rejected with requeue", "requeued by the worker"]
    assert "refused transition" not in worker.log
