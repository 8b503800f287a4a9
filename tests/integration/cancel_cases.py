"""Cancellation cases run on two brokers: test_cancel.py (Redis broker) and
test_on_rabbitmq.py (RabbitMQ) call them with the same arguments.
"""

from __future__ import annotations

import time

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    PUBLISH,
    START,
    dead_letters,
    path,
    transitions,
    unique,
    wait_state,
)

S = TaskState
CANCEL = [(S.STARTED.value, S.CANCELLED.value)]
RESUBMIT = [(S.CANCELLED.value, S.SUBMITTED.value)]


def scheduled_task_cancelled_at_once_and_never_republished(proj, worker_factory):
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=2)
    # Both fail once and wait 2 s in Redis for their retry; the second one is the control.
    doomed = proj.flaky.delay(1, delay=2)
    control = proj.flaky.delay(1, delay=2)
    for result in (doomed, control):
        wait_state(jobbers, result.id, S.SCHEDULED, worker=worker)
    assert doomed.id in {r.task_id for r in jobbers.scheduled()}

    assert jobbers.cancel(doomed.id) is True
    record = jobbers.get(doomed.id)  # at once, no worker involved
    assert record.state == S.CANCELLED
    assert record.run_at is None
    assert doomed.id not in {r.task_id for r in jobbers.scheduled()}
    cancelled = jobbers.history(doomed.id)[-1]
    assert (cancelled.from_state, cancelled.to_state) == (S.SCHEDULED, S.CANCELLED)
    assert cancelled.reason == "cancelled by request"

    # The control's run_at passes and it is republished and completes; the cancelled one,
    # due at the same time, is not.
    assert control.get(timeout=20) == 1
    wait_state(jobbers, control.id, S.COMPLETED, worker=worker)
    record = jobbers.get(doomed.id)
    assert record.state == S.CANCELLED
    assert record.attempt == 1
    assert path(jobbers, doomed.id)[-1] == (S.SCHEDULED.value, S.CANCELLED.value)
    assert transitions(jobbers, doomed.id, S.SUBMITTED) == transitions(
        jobbers, doomed.id, S.SUBMITTED)[:1]  # only the original publish


def started_task_ends_cancelled_at_its_next_heartbeat(proj, worker_factory, pool):
    jobbers = proj.jobbers
    client = proj._redis()  # the Redis the task bodies write their marks to
    worker = worker_factory(pool=pool, concurrency=2)
    key = unique("hb-cancel")
    result = proj.heartbeating.delay(key, 30)
    wait_state(jobbers, result.id, S.STARTED, worker=worker)
    wait_for(lambda: client.lrange(key, 0, -1) == ["started"], message="the task body")
    # The body marks "started" before its first heartbeat, which is always sent: a cancel
    # landing between the two is honoured at once. Cancel once that heartbeat is in, so
    # the next one is a throttle gap (1 s) away and the record is seen still STARTED
    # (unless that heartbeat falls in the few ms between the two calls: then CANCELLED;
    # the reason below says the task, not cancel(), ended it either way).
    wait_for(lambda: jobbers.get(result.id).progress is not None, message="a first heartbeat")

    cancelled_at = time.monotonic()
    assert jobbers.cancel(result.id) is True
    assert jobbers.get(result.id).state in (S.STARTED, S.CANCELLED)  # requested only
    record = wait_state(jobbers, result.id, S.CANCELLED, timeout=10, worker=worker)
    took = time.monotonic() - cancelled_at
    print(f"\n[{pool}] heartbeat cancel: cancel() -> cancelled in {took:.2f}s")
    assert took < 5  # the next heartbeat sent: at most ~1 s later (the throttle)
    assert client.lrange(key, 0, -1) == ["started", "TaskCancelled"]
    assert record.attempt == 1
    assert path(jobbers, result.id) == PUBLISH + START + CANCEL
    assert jobbers.history(result.id)[-1].reason == "cancellation honoured"
    assert jobbers.cancel(result.id) is False

    # The cancellation flag went with the cancel: resubmitted, the task runs normally.
    key = unique("hb-resubmit")
    until = proj.until_released.delay(key)
    wait_state(jobbers, until.id, S.STARTED, worker=worker)
    assert jobbers.cancel(until.id) is True
    wait_state(jobbers, until.id, S.CANCELLED, timeout=10, worker=worker)
    client.set(f"{key}:release", "ok")
    assert jobbers.resubmit([until.id]) == [until.id]
    record = wait_state(jobbers, until.id, S.COMPLETED, worker=worker)
    assert record.attempt == 2
    assert record.progress == {"attempt": 2}
    assert path(jobbers, until.id) == (PUBLISH + START + CANCEL + RESUBMIT
                                        + START + COMPLETE)


def terminate_interrupts_a_prefork_task_that_never_heartbeats(proj, worker_factory):
    jobbers = proj.jobbers
    client = proj._redis()  # the Redis the task bodies write their marks to
    worker = worker_factory(pool="prefork", concurrency=2)
    key = unique("terminate")
    result = proj.silent.delay(key, 60)  # max_stall_recoveries=1, dead_letter_policy=save
    wait_state(jobbers, result.id, S.STARTED, worker=worker)
    wait_for(lambda: client.llen(key) == 1, message="the task body")

    cancelled_at = time.monotonic()
    assert jobbers.cancel(result.id, terminate=True) is True
    assert jobbers.get(result.id).state == S.STARTED
    record = wait_state(jobbers, result.id, S.CANCELLED, timeout=15, worker=worker)
    took = time.monotonic() - cancelled_at
    print(f"\nterminate=True on prefork (jobbers_cancel_grace=1s): cancel() -> cancelled "
          f"in {took:.2f}s; reason {jobbers.history(result.id)[-1].reason!r}")
    # Not before the grace period; then within a liveness refresh (0.6 s here) or so.
    assert 0.9 <= took < 6
    wait_for(lambda: "interrupted proj.silent" in worker.log, timeout=5,
             message="the worker to log the interruption")
    # recorded by the task on its way out (SystemExit: the interruption honours the
    # request), or else by the worker's task_revoked handler
    assert jobbers.history(result.id)[-1].reason in (
        "cancellation honoured: interrupted by its worker",
        "interrupted by the worker (signal 15)")
    assert record.attempt == 1
    assert path(jobbers, result.id) == PUBLISH + START + CANCEL
    assert client.llen(key) == 1

    # The pool replaced its child; nothing recovers or dead-letters the cancelled task.
    assert proj.add.delay(2, 3).get(timeout=20) == 5
    jobbers.clean()
    assert jobbers.get(result.id).state == S.CANCELLED
    assert path(jobbers, result.id) == PUBLISH + START + CANCEL
    assert dead_letters(jobbers, result.id) == []
    assert worker.proc.poll() is None

    # Resubmitted, it runs again on the same worker (Celery's revoke of the interrupted
    # request is not remembered against the id), and can be interrupted again.
    assert jobbers.resubmit([result.id]) == [result.id]
    record = wait_state(jobbers, result.id, S.STARTED, worker=worker)
    assert record.attempt == 2
    wait_for(lambda: client.llen(key) == 2, message="the second run's body")
    assert jobbers.cancel(result.id, terminate=True) is True
    record = wait_state(jobbers, result.id, S.CANCELLED, timeout=15, worker=worker)
    assert record.attempt == 2
    assert path(jobbers, result.id) == (PUBLISH + START + CANCEL + RESUBMIT + START
                                        + CANCEL)
