"""End to end: ``jobbers.purge(name=, queue=, submitted_before=)``.

Matching terminal records are removed (record, history, index entries); matching submitted
and scheduled tasks are cancelled so that they never run; running ones are left alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from jobbers_celery import TaskState
from jobbers_celery.jobbers import PurgeReport
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import unique, wait_state

pytestmark = [pytest.mark.redis]

S = TaskState


def gone(jobbers, task_id: str) -> bool:
    return (jobbers.get(task_id) is None and jobbers.history(task_id) == []
            and task_id not in {r.task_id for r in jobbers.tasks(limit=1000)})


def last_reason(jobbers, task_id: str) -> str | None:
    return jobbers.history(task_id)[-1].reason


def redis_now(jobbers) -> datetime:
    """The Redis clock (what submission times are recorded with), as an aware datetime,
    once it has moved past every submission so far."""
    before = jobbers.store.now_ms()
    wait_for(lambda: jobbers.store.now_ms() > before + 1, message="the Redis clock to move")
    return datetime.fromtimestamp(jobbers.store.now_ms() / 1000, UTC)


def test_purge_refuses_no_criterion_and_naive_datetimes(proj):
    jobbers = proj.jobbers
    pending = proj.add.apply_async((1, 2), queue="purge-nobody")
    with pytest.raises(ValueError, match="at least one of"):
        jobbers.purge()
    with pytest.raises(ValueError, match="at least one of"):
        jobbers.purge(name=None, queue=None, submitted_before=None)
    with pytest.raises(ValueError, match="timezone-aware"):
        jobbers.purge(submitted_before=datetime.now() + timedelta(days=1))
    with pytest.raises(ValueError, match="timezone-aware"):
        jobbers.purge(name="proj.add", submitted_before=datetime(2100, 1, 1))
    assert jobbers.get(pending.id).state == S.SUBMITTED  # nothing was touched
    assert jobbers.purge(name="proj.nothing") == PurgeReport(removed=0, cancelled=[], skipped=[])


@pytest.mark.worker
def test_purge_by_name(proj, worker_factory):
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool="threads", concurrency=4)  # consumes the default queue only
    key = unique("purge")
    done = proj.purgeable.delay(key)
    failed = proj.purgeable.delay(key, fail=True)
    scheduled = proj.purgeable.delay(key, delay=60)
    running = proj.purgeable.delay(key, seconds=30)
    other_done = proj.add.delay(1, 2)
    other_scheduled = proj.flaky.delay(1, delay=60)
    for result, state in [(done, S.COMPLETED), (failed, S.FAILED), (scheduled, S.SCHEDULED),
                          (running, S.STARTED), (other_done, S.COMPLETED),
                          (other_scheduled, S.SCHEDULED)]:
        wait_state(jobbers, result.id, state, worker=worker)
    # Waiting in a queue no worker consumes yet.
    other_key = unique("purge-other")
    pending = proj.purgeable.apply_async((key,), queue="purgeq")
    other_pending = proj.record_run.apply_async((other_key,), queue="purgeq")
    # "started" is recorded just before the body logs its run: wait for the log
    wait_for(lambda: client.llen(key) == 4, timeout=10, message="the four bodies to run")
    ran_before = set(client.lrange(key, 0, -1))
    assert ran_before == {done.id, failed.id, scheduled.id, running.id}

    report = jobbers.purge(name="proj.purgeable")
    print(f"\npurge(name='proj.purgeable') -> {report}")
    assert report.removed == 2
    assert sorted(report.cancelled) == sorted([scheduled.id, pending.id])
    assert report.skipped == [running.id]

    for result in (done, failed):
        assert gone(jobbers, result.id)
    assert {r.task_id for r in jobbers.tasks(name="proj.purgeable")} == {
        scheduled.id, pending.id, running.id}
    for result in (scheduled, pending):
        assert jobbers.get(result.id).state == S.CANCELLED
        assert last_reason(jobbers, result.id) == "purged"
    assert jobbers.get(scheduled.id).run_at is None
    assert [r.task_id for r in jobbers.scheduled()] == [other_scheduled.id]
    assert jobbers.get(running.id).state == S.STARTED
    assert jobbers.get(other_done.id).state == S.COMPLETED
    assert jobbers.get(other_scheduled.id).state == S.SCHEDULED
    assert jobbers.get(other_pending.id).state == S.SUBMITTED
    counts = jobbers.counts()
    assert (counts[S.COMPLETED], counts[S.FAILED], counts[S.CANCELLED]) == (1, 0, 2)

    # A worker for that queue starts only now: the purged task is dropped, the other runs.
    late = worker_factory(pool="threads", concurrency=2, queues="purgeq")
    wait_state(jobbers, other_pending.id, S.COMPLETED, worker=late)
    wait_for(lambda: f"proj.purgeable[{pending.id}]" in late.log, timeout=10,
             message="the purged message to be dropped")
    assert jobbers.get(pending.id).state == S.CANCELLED
    assert set(client.lrange(key, 0, -1)) == ran_before

    # The records purge cancelled stay (tombstones for their queued messages), also through
    # a later purge; the running task is still left alone.
    report = jobbers.purge(name="proj.purgeable")
    assert report == PurgeReport(removed=0, cancelled=[], skipped=[running.id])
    for result in (scheduled, pending):
        assert jobbers.get(result.id).state == S.CANCELLED
        assert last_reason(jobbers, result.id) == "purged"
    assert jobbers.get(running.id).state == S.STARTED

@pytest.mark.worker
def test_purge_by_queue_and_submission_time(proj, worker_factory):
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=2, queues="qa,qb")
    done_a = proj.add.apply_async((0, 1), queue="qa")
    done_b = proj.add.apply_async((0, 2), queue="qb")
    for result in (done_a, done_b):
        wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert worker.stop() == 0
    # No worker consumes these queues now: everything published stays submitted.
    a1 = proj.add.apply_async((1, 1), queue="qa")
    a2 = proj.record_run.apply_async(("proj:unused",), queue="qa")
    c0 = proj.add.apply_async((1, 3), queue="qb")
    cutoff = redis_now(jobbers)
    b1 = proj.add.apply_async((1, 2), queue="qa")
    c1 = proj.add.apply_async((1, 4), queue="qb")
    for result in (a1, a2, c0, b1, c1):
        assert jobbers.get(result.id).state == S.SUBMITTED
    assert jobbers.get(a2.id).submitted_at < cutoff <= jobbers.get(b1.id).submitted_at

    # queue and time together (any timezone, as long as it is aware)
    plus2 = cutoff.astimezone(timezone(timedelta(hours=2)))
    report = jobbers.purge(queue="qa", submitted_before=plus2)
    assert (report.removed, sorted(report.cancelled), report.skipped) == (
        1, sorted([a1.id, a2.id]), [])
    assert gone(jobbers, done_a.id)
    states = {r: jobbers.get(r.id).state for r in (a1, a2, c0, b1, c1, done_b)}
    assert states == {a1: S.CANCELLED, a2: S.CANCELLED, c0: S.SUBMITTED, b1: S.SUBMITTED,
                      c1: S.SUBMITTED, done_b: S.COMPLETED}

    # name and queue together: b1 is cancelled; a2 is another task, c0 and c1 in another
    # queue; a1, cancelled by the purge before, stays as a tombstone.
    report = jobbers.purge(name="proj.add", queue="qa")
    assert report == PurgeReport(removed=0, cancelled=[b1.id], skipped=[])
    assert jobbers.get(a1.id).state == S.CANCELLED
    assert jobbers.get(a2.id).state == S.CANCELLED

    # time alone, across queues
    report = jobbers.purge(submitted_before=cutoff)
    assert report == PurgeReport(removed=1, cancelled=[c0.id], skipped=[])
    assert gone(jobbers, done_b.id)
    assert jobbers.get(c1.id).state == S.SUBMITTED  # submitted after the cutoff

    # queue alone
    assert jobbers.purge(queue="qb") == PurgeReport(removed=0, cancelled=[c1.id], skipped=[])
    assert jobbers.purge(queue="qb") == PurgeReport()
    remaining = {r.task_id: r for r in jobbers.tasks()}
    assert set(remaining) == {a1.id, a2.id, b1.id, c0.id, c1.id}
    for task_id, record in remaining.items():
        assert record.state == S.CANCELLED
        assert last_reason(jobbers, task_id) == "purged"

@pytest.mark.worker
def test_a_task_cancelled_then_purged_never_runs(proj, worker_factory):
    # cancel() while it waits in the queue, then purge its name: the record goes, the
    # message stays in the broker until a worker takes it.
    jobbers = proj.jobbers
    client = jobbers.store.client
    key = unique("purged-tombstone")
    doomed = proj.purgeable.delay(key).id  # no AsyncResult kept: the test is expected to fail
    assert jobbers.cancel(doomed) is True
    assert jobbers.purge(name="proj.purgeable") == PurgeReport(removed=1)
    assert gone(jobbers, doomed)

    worker = worker_factory(pool="threads", concurrency=2)
    follower = proj.record_run.delay(unique("follower")).id
    wait_state(jobbers, follower, S.COMPLETED, worker=worker)
    wait_for(lambda: f"proj.purgeable[{doomed}]" in worker.log, timeout=10,
             message="the worker to receive the purged message")
    # the worker logs what it did with it (ran, ignored, dropped) after "received"
    wait_for(lambda: worker.log.count(f"proj.purgeable[{doomed}]") >= 2, timeout=10,
             message="the worker to drop or run it")
    assert client.llen(key) == 0, "the purged task ran"
    assert jobbers.get(doomed) is None
