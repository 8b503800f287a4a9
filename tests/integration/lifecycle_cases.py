"""Lifecycle cases run on two brokers: test_lifecycle.py (Redis broker) and
test_on_rabbitmq.py (RabbitMQ) call them with the same arguments.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    DELAYED_RETRY,
    IMMEDIATE_RETRY,
    PUBLISH,
    START,
    assert_utc,
    dead_letters,
    path,
    transitions,
    unique,
    wait_state,
)

S = TaskState


def started_then_completed_with_timestamps(proj, worker_factory, pool):
    jobbers = proj.jobbers
    worker = worker_factory(pool=pool, concurrency=2)
    result = proj.add.delay(2, 3)
    assert result.get(timeout=20) == 5
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert record.name == "proj.add"
    assert record.version == 1
    assert record.queue == "celery"
    assert record.attempt == 1
    assert record.retry_attempt == 0
    assert record.worker == worker.name
    assert record.error is None
    assert record.run_at is None
    assert record.retried_at is None
    assert_utc(record.submitted_at, record.started_at, record.completed_at, record.heartbeat_at)
    assert record.submitted_at <= record.started_at <= record.completed_at
    history = jobbers.history(result.id)
    assert path(jobbers, result.id) == PUBLISH + START + COMPLETE
    assert [t.attempt for t in history] == [0, 1, 1]
    assert [t.worker for t in history] == [None, worker.name, worker.name]
    assert_utc(*(t.at for t in history))
    assert [t.at for t in history] == [record.submitted_at, record.started_at,
                                       record.completed_at]
    assert jobbers.counts()[S.COMPLETED] == 1


def expected_exception_without_delay_retries_immediately(proj, worker_factory, pool):
    jobbers = proj.jobbers
    worker = worker_factory(pool=pool, concurrency=2)
    result = proj.flaky.delay(2)
    assert result.get(timeout=20) == 2
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert record.attempt == 3
    assert record.retry_attempt == 2
    assert_utc(record.started_at, record.retried_at, record.completed_at)
    assert record.submitted_at <= record.started_at < record.retried_at <= record.completed_at
    assert record.run_at is None
    history = jobbers.history(result.id)
    assert path(jobbers, result.id) == (
        PUBLISH + START + IMMEDIATE_RETRY + IMMEDIATE_RETRY + COMPLETE)
    assert [t.attempt for t in history] == [0, 1, 1, 1, 2, 2, 2, 3, 3]
    retries = transitions(jobbers, result.id, S.UNSUBMITTED)
    assert [t.reason for t in retries] == ["retry 1 of 3", "retry 2 of 3"]
    assert {t.worker for t in retries} == {worker.name}
    assert dead_letters(jobbers, result.id) == []


def expected_exception_with_delay_waits_in_scheduled(proj, worker_factory, pool):
    jobbers = proj.jobbers
    worker = worker_factory(pool=pool, concurrency=2)
    slow = proj.flaky.delay(1, delay=1.2)     # countdown given to self.retry()
    fast = proj.flaky.delay(1, delay=0.6)
    option = proj.flaky_delay.delay(2)        # retry_delay=0.3, constant backoff

    def both_waiting():
        waiting = jobbers.scheduled()
        ids = [r.task_id for r in waiting]
        return waiting if {slow.id, fast.id} <= set(ids) else None

    waiting = wait_for(both_waiting, timeout=10, message="both delayed retries scheduled")
    run_ats = [r.run_at for r in waiting]
    assert run_ats == sorted(run_ats)  # ordered by run_at
    ids = [r.task_id for r in waiting]
    assert ids.index(fast.id) < ids.index(slow.id)
    run_at = {}
    for record in waiting:
        if record.task_id in (slow.id, fast.id):
            assert record.state == S.SCHEDULED
            assert record.attempt == 1
            assert record.retry_attempt == 1
            assert record.error is not None
            assert record.error.message == "attempt 1"
            assert_utc(record.run_at)
            run_at[record.task_id] = record.run_at

    assert fast.get(timeout=20) == 1
    assert slow.get(timeout=20) == 1
    assert option.get(timeout=20) == 2
    for result, delay in ((fast, 0.6), (slow, 1.2)):
        record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
        assert record.attempt == 2
        assert record.retry_attempt == 1
        assert record.run_at is None
        assert path(jobbers, result.id) == PUBLISH + START + DELAYED_RETRY + COMPLETE
        scheduled = transitions(jobbers, result.id, S.SCHEDULED)[0]
        assert scheduled.reason == "retry 1 of 3"
        assert scheduled.worker == worker.name
        assert run_at[result.id] == scheduled.at + timedelta(seconds=delay)
        republished = transitions(jobbers, result.id, S.SUBMITTED)[-1]
        assert republished.reason == "run_at reached"
        assert republished.worker == worker.name
        late = (republished.at - run_at[result.id]).total_seconds()
        assert 0 <= late < 1.5, f"re-published {late:.3f}s after run_at"

    record = wait_state(jobbers, option.id, S.COMPLETED, worker=worker)
    assert record.attempt == 3
    assert record.retry_attempt == 2
    assert path(jobbers, option.id) == PUBLISH + START + DELAYED_RETRY + DELAYED_RETRY + COMPLETE
    history = jobbers.history(option.id)
    for before, after in itertools.pairwise(history):
        if before.to_state == S.SCHEDULED:
            waited = (after.at - before.at).total_seconds()
            assert 0.3 <= waited < 0.3 + 1.5, waited
    assert jobbers.scheduled() == []


def retries_and_resubmits_stay_on_the_tasks_queue(proj, worker_factory):
    # The worker consumes only "other": a retry or resubmit routed elsewhere never runs.
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=2, queues="other")
    delayed = proj.flaky.apply_async((1,), {"delay": 0.3}, queue="other")
    immediate = proj.flaky.apply_async((1,), queue="other")
    failing = proj.fail_once.apply_async((unique("queue"),), queue="other")
    for result, retry in ((delayed, DELAYED_RETRY), (immediate, IMMEDIATE_RETRY)):
        record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
        assert record.queue == "other"
        assert path(jobbers, result.id) == PUBLISH + START + retry + COMPLETE
    wait_state(jobbers, failing.id, S.FAILED, worker=worker)
    assert jobbers.resubmit([failing.id]) == [failing.id]
    record = wait_state(jobbers, failing.id, S.COMPLETED, worker=worker)
    assert record.queue == "other"
    assert record.attempt == 2
    listed = jobbers.tasks(queue="other", limit=10)
    assert {r.task_id for r in listed} == {failing.id, immediate.id, delayed.id}
    assert [r.submitted_at for r in listed] == sorted(
        (r.submitted_at for r in listed), reverse=True)  # newest first


def duplicate_delivery_runs_the_body_once(proj, worker_factory, pool):
    jobbers = proj.jobbers
    client = proj._redis()  # the Redis the task bodies write their marks to
    worker = worker_factory(pool=pool, concurrency=2)
    key = unique("runs")

    def refused_starts(previous: str) -> int:
        return jobbers.store.refused_counts().get(f"refused:{previous}>started", 0)

    # 1. A second message with the same id while the first one is running.
    first = proj.record_run.apply_async((key, 1.0))
    wait_state(jobbers, first.id, S.STARTED, worker=worker)
    proj.app.send_task("proj.record_run", args=(key, 1.0), task_id=first.id)
    wait_for(lambda: refused_starts("started") >= 1, timeout=10,
             message="the duplicate delivery to be refused")
    assert first.get(timeout=20) == 1
    record = wait_state(jobbers, first.id, S.COMPLETED, worker=worker)
    assert record.attempt == 1
    assert client.lrange(key, 0, -1) == [f"{first.id}:1"]
    wait_for(lambda: "duplicate or stale delivery" in worker.log, timeout=5,
             message="the worker's warning about the duplicate delivery")

    # 2. The same id published again after it completed.
    proj.record_run.apply_async((key, 0.0), task_id=first.id)
    wait_for(lambda: refused_starts("completed") >= 1, timeout=10,
             message="the late duplicate to be refused")
    assert client.llen(key) == 1
    record = jobbers.get(first.id)
    assert record.state == S.COMPLETED
    assert record.attempt == 1
    # Neither duplicate publish changed the history.
    assert path(jobbers, first.id) == PUBLISH + START + COMPLETE
    refused = jobbers.store.refused_counts()
    assert refused.get("refused:started>submitted") == 1
    assert refused.get("refused:completed>submitted") == 1
    # The worker still runs new work.
    assert proj.add.delay(1, 2).get(timeout=20) == 3
