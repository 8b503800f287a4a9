"""End to end: durable cancellation (``jobbers.cancel``) in every state a task can be in.

Real worker subprocesses against the session's private Redis. Unlike Celery's in-memory
revoke, a jobbers cancellation lives in Redis: a worker that starts after the cancel still
never runs the task.
"""

from __future__ import annotations

import pytest

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration import cancel_cases
from tests.integration.cancel_cases import CANCEL, RESUBMIT
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    FAIL,
    IMMEDIATE_RETRY,
    PUBLISH,
    START,
    dead_letters,
    path,
    unique,
    wait_state,
)

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
CANCEL_PENDING = [(S.SUBMITTED.value, S.CANCELLED.value)]


def test_submitted_task_cancelled_before_any_worker_never_runs(proj, worker_factory):
    jobbers = proj.jobbers
    client = jobbers.store.client
    key = unique("cancel-submitted")
    doomed = proj.record_run.delay(key)
    assert jobbers.get(doomed.id).state == S.SUBMITTED

    assert jobbers.cancel(doomed.id) is True
    record = jobbers.get(doomed.id)
    assert record.state == S.CANCELLED
    assert record.completed_at is not None
    assert path(jobbers, doomed.id) == PUBLISH + CANCEL_PENDING
    assert jobbers.history(doomed.id)[-1].reason == "cancelled by request"
    # Already final: a second cancel has nothing to do.
    assert jobbers.cancel(doomed.id) is False

    # The message is still in the broker; a worker started only now receives it.
    worker = worker_factory(pool="prefork", concurrency=2)
    follower = proj.record_run.delay(unique("follower"))
    wait_state(jobbers, follower.id, S.COMPLETED, worker=worker)
    wait_for(lambda: f"proj.record_run[{doomed.id}]" in worker.log, timeout=10,
             message="the worker to drop the cancelled message")
    assert client.llen(key) == 0, "the body of a cancelled task ran"
    record = jobbers.get(doomed.id)
    assert record.state == S.CANCELLED
    assert record.attempt == 0
    assert path(jobbers, doomed.id) == PUBLISH + CANCEL_PENDING

    # Unknown and finished tasks cannot be cancelled.
    assert jobbers.cancel("no-such-task") is False
    assert jobbers.cancel(follower.id) is False
    assert jobbers.get(follower.id).state == S.COMPLETED

    # A cancelled task can be resubmitted; it then runs normally.
    assert jobbers.resubmit([doomed.id]) == [doomed.id]
    record = wait_state(jobbers, doomed.id, S.COMPLETED, worker=worker)
    assert record.attempt == 1
    assert client.lrange(key, 0, -1) == [f"{doomed.id}:1"]
    assert path(jobbers, doomed.id) == PUBLISH + CANCEL_PENDING + RESUBMIT + START + COMPLETE


def test_scheduled_task_cancelled_at_once_and_never_republished(proj, worker_factory):
    cancel_cases.scheduled_task_cancelled_at_once_and_never_republished(proj, worker_factory)


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_started_task_ends_cancelled_at_its_next_heartbeat(proj, worker_factory, pool):
    cancel_cases.started_task_ends_cancelled_at_its_next_heartbeat(proj, worker_factory, pool)


def test_started_task_without_heartbeats_ends_cancelled_at_its_retry_or_failure_step(
        proj, worker_factory):
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool="threads", concurrency=2)
    runs = {how: unique(f"step-{how}") for how in ("flaky", "boom")}
    results = {how: proj.until_released.delay(key, beat=False) for how, key in runs.items()}
    for result in results.values():
        wait_state(jobbers, result.id, S.STARTED, worker=worker)
        assert jobbers.cancel(result.id) is True
    for how, key in runs.items():
        client.set(f"{key}:release", how)
    for how, result in results.items():
        record = wait_state(jobbers, result.id, S.CANCELLED, worker=worker)
        assert client.lrange(runs[how], 0, -1) == ["1:start", f"1:{how}"], how
        assert record.attempt == 1, how
        assert path(jobbers, result.id) == PUBLISH + START + CANCEL, how
        step = "retry 1 of 3" if how == "flaky" else "unexpected exception"
        assert jobbers.history(result.id)[-1].reason == f"cancellation requested; {step}", how
        assert dead_letters(jobbers, result.id) == [], how  # cancelled is not a failure

    failed = proj.boom.delay()
    wait_state(jobbers, failed.id, S.FAILED, worker=worker)
    assert jobbers.cancel(failed.id) is False
    assert jobbers.cancel(failed.id, terminate=True) is False
    assert path(jobbers, failed.id) == PUBLISH + START + FAIL


def test_terminate_interrupts_a_prefork_task_that_never_heartbeats(proj, worker_factory):
    cancel_cases.terminate_interrupts_a_prefork_task_that_never_heartbeats(proj, worker_factory)


def test_terminate_on_the_threads_pool_cannot_interrupt(proj, worker_factory):
    # A thread cannot be interrupted: the task runs to its end. It never heartbeats and
    # ends without an error, so its completion is recorded (completion is not one of the
    # steps that honour a cancellation request) and the request is dropped with it.
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool="threads", concurrency=2)
    key = unique("terminate-threads")
    result = proj.until_released.delay(key, beat=False)
    wait_state(jobbers, result.id, S.STARTED, worker=worker)
    assert jobbers.cancel(result.id, terminate=True) is True
    wait_for(lambda: "cannot interrupt a running task" in worker.log, timeout=10,
             message="the worker to report it cannot interrupt")
    assert jobbers.get(result.id).state == S.STARTED
    client.set(f"{key}:release", "ok")
    assert result.get(timeout=20) == "ok"
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert path(jobbers, result.id) == PUBLISH + START + COMPLETE
    assert "cancel" not in jobbers.store.get_raw(result.id)
    assert jobbers.cancel(result.id) is False
    assert record.attempt == 1


def test_cancel_between_an_immediate_retry_and_its_publish(proj, worker_factory):
    # proj.retry_window cancels itself inside the retry's apply_async: after the
    # started -> unsubmitted step, before the message goes out.
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool="prefork", concurrency=2)
    key = unique("window")
    result = proj.retry_window.delay(key)
    record = wait_state(jobbers, result.id, S.CANCELLED, worker=worker)
    assert client.lrange(f"proj:retry_window:{result.id}", 0, -1) == ["True"]
    assert client.lrange(key, 0, -1) == ["1"], "the retry ran after the cancel"
    assert record.attempt == 1
    assert path(jobbers, result.id) == (PUBLISH + START + IMMEDIATE_RETRY[:2]
                                        + CANCEL_PENDING)
    assert jobbers.history(result.id)[-1].reason == "cancellation requested"
    assert "cancel" not in jobbers.store.get_raw(result.id)

