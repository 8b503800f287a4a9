"""End to end: every lifecycle path of docs/reference/lifecycle.md, through real worker
subprocesses.

Each test starts its own worker (``worker_factory``) against the session's private Redis,
which is flushed between tests. Waits poll a condition with a deadline; nothing sleeps.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration import lifecycle_cases
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    DELAYED_RETRY,
    FAIL,
    IMMEDIATE_RETRY,
    POOLS,
    PUBLISH,
    START,
    assert_utc,
    dead_letters,
    ms,
    path,
    transitions,
    unique,
    wait_state,
)

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState


# ----------------------------------------------------------------------------- publish
@pytest.mark.parametrize("pool", POOLS)
def test_every_publish_path_records_submitted_and_stamps_headers(proj, worker_factory, pool):
    jobbers = proj.jobbers
    before = jobbers.store.now_ms()
    results = {
        "delay": proj.headers.delay(),
        "apply_async": proj.headers.apply_async(),
        "send_task": proj.app.send_task("proj.headers"),
        "signature": proj.headers.s().apply_async(),
    }
    chain = (proj.add.si(1, 2) | proj.headers.si()).apply_async()
    after = jobbers.store.now_ms()

    # No worker yet: every publish is recorded as submitted, nothing more.
    for how, result in [*results.items(), ("chain head", chain.parent)]:
        record = jobbers.get(result.id)
        assert record is not None, how
        assert record.state == S.SUBMITTED, how
        assert (record.attempt, record.retry_attempt) == (0, 0), how
        assert (record.version, record.queue) == (1, "celery"), how
        assert (record.started_at, record.completed_at) == (None, None), how
        assert_utc(record.submitted_at)
        assert before <= ms(record.submitted_at) <= after, how
        history = jobbers.history(result.id)
        assert path(jobbers, result.id) == PUBLISH, how
        assert (history[0].reason, history[0].attempt) == ("published", 0), how
        assert history[0].at == record.submitted_at, how
    assert jobbers.get(chain.parent.id).name == "proj.add"
    # The chain's second link is published by the worker once the first one is done.
    assert jobbers.get(chain.id) is None

    worker = worker_factory(pool=pool, concurrency=2)
    for how, result in results.items():
        headers = result.get(timeout=20)
        record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
        assert record.name == "proj.headers", how
        assert headers["jobbers_task"] == "proj.headers", how
        assert headers["jobbers_version"] == 1, how
        # Stamped with the Redis time of the submitted step, once.
        assert headers["jobbers_enqueued_at"] == ms(record.submitted_at), how
        assert headers["jobbers_published_at"] == headers["jobbers_enqueued_at"], how
        assert path(jobbers, result.id) == PUBLISH + START + COMPLETE, how
        assert record.worker == worker.name, how

    headers = chain.get(timeout=20)
    head = wait_state(jobbers, chain.parent.id, S.COMPLETED, worker=worker)
    link = wait_state(jobbers, chain.id, S.COMPLETED, worker=worker)
    assert link.name == "proj.headers"
    assert head.name == "proj.add"
    assert path(jobbers, chain.id) == PUBLISH + START + COMPLETE
    assert headers["jobbers_task"] == "proj.headers"
    assert headers["jobbers_version"] == 1
    assert headers["jobbers_enqueued_at"] == ms(link.submitted_at)
    # Published by the worker once the head returned, in Celery's order: the chain's next
    # task, then the head's result, then its completion (recorded after Celery's write).
    assert head.started_at <= link.submitted_at <= head.completed_at
    assert transitions(jobbers, chain.id, S.SUBMITTED)[0].reason == "published"


@pytest.mark.parametrize("pool", POOLS)
def test_headers_survive_immediate_and_delayed_retries(proj, worker_factory, pool):
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool=pool, concurrency=2)
    runs = {"immediate": (unique("hdr"), None), "delayed": (unique("hdr"), 0.3)}
    results = {how: proj.headers_retry.delay(key, delay=delay)
               for how, (key, delay) in runs.items()}
    for how, result in results.items():
        final = result.get(timeout=20)
        record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
        key = runs[how][0]
        first, second = (json.loads(x) for x in client.lrange(key, 0, -1))
        enqueued = ms(record.submitted_at)
        assert first["jobbers_enqueued_at"] == enqueued, how
        assert second["jobbers_enqueued_at"] == enqueued, how  # kept across the retry
        assert final == second
        assert second["jobbers_published_at"] > first["jobbers_published_at"], how
        assert second["jobbers_task"] == first["jobbers_task"] == "proj.headers_retry", how
        assert second["jobbers_version"] == first["jobbers_version"] == 1, how
        assert (record.attempt, record.retry_attempt) == (2, 1), how
        resubmit = IMMEDIATE_RETRY if how == "immediate" else DELAYED_RETRY
        assert path(jobbers, result.id) == PUBLISH + START + resubmit + COMPLETE, how
        # Stamped when the second attempt was published (Redis clock), not carried over.
        republished = ms(transitions(jobbers, result.id, S.SUBMITTED)[-1].at)
        assert 0 <= second["jobbers_published_at"] - republished < 1000, how


@pytest.mark.parametrize("pool", POOLS)
def test_message_published_without_a_record_is_recorded_by_the_worker(
        proj, worker_factory, pool, monkeypatch):
    # Redis unreachable at publish time: the submitted step fails, the message goes out
    # unrecorded (and without the epoch header of a recorded submission).
    import redis

    jobbers = proj.jobbers

    def unreachable(*args: object, **kwargs: object) -> None:
        raise redis.ConnectionError("Redis is unreachable (simulated)")

    with monkeypatch.context() as patched:
        patched.setattr(jobbers.store, "step", unreachable)
        result = proj.add.delay(4, 5)
    assert jobbers.get(result.id) is None
    worker = worker_factory(pool=pool, concurrency=2)
    assert result.get(timeout=20) == 9
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert record.name == "proj.add"
    assert record.version == 1
    assert record.queue == "celery"
    assert record.attempt == 1
    assert record.worker == worker.name
    assert path(jobbers, result.id) == PUBLISH + START + COMPLETE
    assert jobbers.history(result.id)[0].reason == "recorded by the worker: no submission record"


# ----------------------------------------------------------------------------- outcomes
@pytest.mark.parametrize("pool", POOLS)
def test_started_then_completed_with_timestamps(proj, worker_factory, pool):
    lifecycle_cases.started_then_completed_with_timestamps(proj, worker_factory, pool)


@pytest.mark.parametrize("pool", POOLS)
def test_expected_exception_without_delay_retries_immediately(proj, worker_factory, pool):
    lifecycle_cases.expected_exception_without_delay_retries_immediately(proj, worker_factory, pool)


@pytest.mark.parametrize("pool", POOLS)
def test_expected_exception_with_delay_waits_in_scheduled(proj, worker_factory, pool):
    lifecycle_cases.expected_exception_with_delay_waits_in_scheduled(proj, worker_factory, pool)


@pytest.mark.parametrize("pool", POOLS)
def test_retries_exhausted_fail_with_dead_letter(proj, worker_factory, pool):
    jobbers = proj.jobbers
    worker = worker_factory(pool=pool, concurrency=2)
    immediate = proj.flaky.delay(5)   # max_retries=3, no delay
    delayed = proj.backoff.delay()    # max_retries=2, retry_delay=0.5
    cases = [
        (immediate, "proj.flaky", [5], "attempt 4", 4, 3,
         PUBLISH + START + IMMEDIATE_RETRY * 3 + FAIL),
        (delayed, "proj.backoff", [], "always, attempt 3", 3, 2,
         PUBLISH + START + DELAYED_RETRY * 2 + FAIL),
    ]
    for result, name, args, message, attempt, retries, expected in cases:
        record = wait_state(jobbers, result.id, S.FAILED, worker=worker)
        assert path(jobbers, result.id) == expected, name
        assert (record.attempt, record.retry_attempt) == (attempt, retries), name
        assert record.error is not None
        assert record.error.type == "tests.integration.proj.Flaky", name
        assert record.error.message == message, name
        assert_utc(record.completed_at)
        failed = transitions(jobbers, result.id, S.FAILED)[-1]
        assert (failed.reason, failed.worker) == ("retries exhausted", worker.name), name
        assert failed.at == record.completed_at
        entry = wait_for(lambda r=result: dead_letters(jobbers, r.id), timeout=5,
                         message=f"dead letter of {name}")
        assert len(entry) == 1, name
        entry = entry[0]
        assert entry.name == name
        assert entry.reason == "failed"
        assert entry.version == 1
        assert entry.args == args
        assert entry.kwargs == {}
        assert entry.exception_type == "tests.integration.proj.Flaky"
        assert entry.exception_message == message
        assert entry.traceback
        assert "Flaky" in entry.traceback
        assert "Traceback" in entry.traceback
        assert entry.attempt == attempt
        assert entry.retry_attempt == retries
        assert entry.worker == worker.name
        assert entry.queue == "celery"
        assert entry.failed_at == record.completed_at
    assert jobbers.counts()[S.FAILED] == 2


@pytest.mark.parametrize("pool", POOLS)
def test_unexpected_exception_fails_at_once_with_dead_letter(proj, worker_factory, pool):
    jobbers = proj.jobbers
    worker = worker_factory(pool=pool, concurrency=2)
    result = proj.boom.delay(secret="s3cr3t")
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=20)
    record = wait_state(jobbers, result.id, S.FAILED, worker=worker)
    assert path(jobbers, result.id) == PUBLISH + START + FAIL
    assert record.attempt == 1
    assert record.retry_attempt == 0
    assert record.error is not None
    assert (record.error.type, record.error.message) == ("ValueError", "boom")
    assert transitions(jobbers, result.id, S.FAILED)[0].reason == "unexpected exception"
    [entry] = wait_for(lambda: dead_letters(jobbers, result.id), timeout=5,
                       message="dead letter")
    assert entry.reason == "failed"
    assert entry.name == "proj.boom"
    assert entry.args == []
    assert entry.kwargs == {"secret": "s3cr3t"}
    assert (entry.exception_type, entry.exception_message) == ("ValueError", "boom")
    assert "raise ValueError" in (entry.traceback or "")
    assert entry.attempt == 1
    assert entry.worker == worker.name


def test_timeout_counts_as_expected_exception(proj, worker_factory):
    # Only prefork enforces time limits (Celery: threads and solo ignore them).
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=2)
    result = proj.timeout.delay()  # timeout=0.5, max_retries=1, sleeps 5 s
    record = wait_state(jobbers, result.id, S.FAILED, timeout=15, worker=worker)
    assert path(jobbers, result.id) == PUBLISH + START + IMMEDIATE_RETRY + FAIL
    assert record.attempt == 2
    assert record.retry_attempt == 1
    assert record.error is not None
    assert record.error.type == "jobbers_celery.core.errors.TaskTimeout"
    assert record.error.message == "ran longer than timeout=0.5s"
    assert [t.reason for t in jobbers.history(result.id)][2] == "retry 1 of 1"
    assert transitions(jobbers, result.id, S.FAILED)[0].reason == "retries exhausted"
    # Each attempt was cut short: nowhere near the task's 5 s sleep.
    history = jobbers.history(result.id)
    for started, ended in ((1, 2), (4, 5)):
        assert history[started].to_state == S.STARTED
        assert (history[ended].at - history[started].at).total_seconds() < 3
    [entry] = wait_for(lambda: dead_letters(jobbers, result.id), timeout=5,
                       message="dead letter")
    assert entry.exception_type == "jobbers_celery.core.errors.TaskTimeout"
    assert entry.attempt == 2


# ----------------------------------------------------------------------------- drops
@pytest.mark.parametrize("pool", POOLS)
def test_unregistered_name_is_dropped(proj, worker_factory, pool):
    jobbers = proj.jobbers
    worker = worker_factory(pool=pool, concurrency=2)
    result = proj.app.send_task("proj.does_not_exist", args=[1], kwargs={"k": 2})
    record = wait_state(jobbers, result.id, S.DROPPED, worker=worker)
    assert record.name == "proj.does_not_exist"
    assert record.version is None
    assert record.attempt == 1  # the drop counts as an attempt, never as a start
    assert record.started_at is None
    assert_utc(record.completed_at)
    assert path(jobbers, result.id) == [*PUBLISH, (S.SUBMITTED.value, S.DROPPED.value)]
    dropped = transitions(jobbers, result.id, S.DROPPED)[0]
    reason = "no task named 'proj.does_not_exist' is registered on this worker"
    assert dropped.reason == reason
    assert dropped.worker == worker.name
    assert record.error is not None
    assert record.error.message == reason
    # The worker goes on.
    assert proj.add.delay(1, 1).get(timeout=20) == 2

    # A dropped task is resubmittable; a worker that still lacks the name drops it again.
    assert jobbers.resubmit([result.id]) == [result.id]
    wait_for(lambda: len(path(jobbers, result.id)) == 4, timeout=20,
             message="the resubmitted task to be dropped again")
    assert path(jobbers, result.id)[2:] == [(S.DROPPED.value, S.SUBMITTED.value),
                                            (S.SUBMITTED.value, S.DROPPED.value)]
    assert jobbers.get(result.id).state == S.DROPPED


@pytest.mark.parametrize("pool", POOLS)
def test_version_mismatch_is_dropped_with_dead_letter(proj, worker_factory, pool):
    jobbers = proj.jobbers
    worker = worker_factory(pool=pool, concurrency=2, env={"PROJ_VERSION": "2"})
    assert proj.versioned.version == 1  # this process publishes version 1
    result = proj.versioned.delay()
    record = wait_state(jobbers, result.id, S.DROPPED, worker=worker)
    assert record.version == 1
    assert record.attempt == 1  # the drop counts as an attempt, never as a start
    assert record.started_at is None
    assert path(jobbers, result.id) == [*PUBLISH, (S.SUBMITTED.value, S.DROPPED.value)]
    reason = "message version 1 differs from worker version 2"
    dropped = transitions(jobbers, result.id, S.DROPPED)[0]
    assert dropped.reason == reason
    assert dropped.worker == worker.name
    assert record.error is not None
    assert record.error.type == "jobbers_celery.worker.request.VersionMismatch"
    assert record.error.message == reason
    [entry] = wait_for(lambda: dead_letters(jobbers, result.id), timeout=5,
                       message="dead letter")
    assert entry.reason == "dropped"
    assert entry.name == "proj.versioned"
    assert entry.version == 1
    assert entry.exception_type == "jobbers_celery.worker.request.VersionMismatch"
    assert entry.exception_message == reason
    assert entry.worker == worker.name
    # The worker keeps processing the next task.
    follow = proj.add.delay(20, 22)
    assert follow.get(timeout=20) == 42
    wait_state(jobbers, follow.id, S.COMPLETED, worker=worker)
    assert jobbers.get(result.id).state == S.DROPPED


@pytest.mark.parametrize("pool", POOLS)
def test_task_missing_on_the_worker_is_dropped_with_dead_letter(proj, worker_factory, pool):
    # This process knows proj.optional (dead_letter_policy=save); the legacy worker does not.
    jobbers = proj.jobbers
    worker = worker_factory(pool=pool, concurrency=2, env={"PROJ_LEGACY": "1"})
    result = proj.optional.delay(7)
    record = wait_state(jobbers, result.id, S.DROPPED, worker=worker)
    assert record.version == 1
    assert path(jobbers, result.id) == [*PUBLISH, (S.SUBMITTED.value, S.DROPPED.value)]
    reason = "no task named 'proj.optional' is registered on this worker"
    [entry] = wait_for(lambda: dead_letters(jobbers, result.id), timeout=5,
                       message="dead letter")
    assert entry.reason == "dropped"
    assert entry.name == "proj.optional"
    assert entry.version == 1
    assert entry.args == [7]
    assert entry.exception_message == reason
    assert entry.worker == worker.name
    assert entry.attempt == 1


@pytest.mark.parametrize("pool", POOLS)
def test_tracked_message_for_a_plain_task_on_the_worker_is_dropped(proj, worker_factory, pool):
    # The publisher tracks proj.sometimes_plain; on the legacy worker it is a plain task: it
    # still runs, untracked, and the record says so instead of claiming "submitted" forever.
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool=pool, concurrency=2, env={"PROJ_LEGACY": "1"})
    key = unique("plain")
    result = proj.sometimes_plain.delay(key)
    assert result.get(timeout=20) == 1
    assert client.lrange(key, 0, -1) == ["plain"]
    record = wait_state(jobbers, result.id, S.DROPPED, worker=worker)
    assert path(jobbers, result.id) == [*PUBLISH, (S.SUBMITTED.value, S.DROPPED.value)]
    assert transitions(jobbers, result.id, S.DROPPED)[0].reason == (
        "proj.sometimes_plain is not a JobbersTask on this worker; it runs untracked")
    assert record.error is not None
    assert dead_letters(jobbers, result.id) == []


# ----------------------------------------------------------------------------- duplicates
@pytest.mark.parametrize("pool", POOLS)
def test_duplicate_delivery_runs_the_body_once(proj, worker_factory, pool):
    lifecycle_cases.duplicate_delivery_runs_the_body_once(proj, worker_factory, pool)


@pytest.mark.parametrize("pool", POOLS)
def test_duplicate_messages_queued_before_any_worker_run_once(proj, worker_factory, pool):
    jobbers = proj.jobbers
    client = jobbers.store.client
    key = unique("runs")
    first = proj.record_run.apply_async((key, 0.3))
    proj.record_run.apply_async((key, 0.3), task_id=first.id)
    proj.app.send_task("proj.record_run", args=(key, 0.3), task_id=first.id)
    assert jobbers.store.refused_counts().get("refused:submitted>submitted") == 2
    assert path(jobbers, first.id) == PUBLISH

    worker = worker_factory(pool=pool, concurrency=2)
    record = wait_state(jobbers, first.id, S.COMPLETED, worker=worker)

    def refused_starts() -> int:
        counts = jobbers.store.refused_counts()
        return counts.get("refused:started>started", 0) + counts.get(
            "refused:completed>started", 0)

    wait_for(lambda: refused_starts() == 2, timeout=10,
             message="both duplicate deliveries to be refused")
    assert client.lrange(key, 0, -1) == [f"{first.id}:1"]
    assert record.attempt == 1
    assert path(jobbers, first.id) == PUBLISH + START + COMPLETE


# ----------------------------------------------------------------------------- resubmit
@pytest.mark.parametrize("pool", POOLS)
def test_resubmit_failed_task_runs_it_again(proj, worker_factory, pool):
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool=pool, concurrency=2)
    key = unique("resubmit")
    result = proj.fail_once.delay(key)
    failed = wait_state(jobbers, result.id, S.FAILED, worker=worker)
    assert failed.attempt == 1
    wait_for(lambda: dead_letters(jobbers, result.id), timeout=5, message="dead letter")

    assert jobbers.resubmit([result.id]) == [result.id]
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert client.lrange(key, 0, -1) == ["1", "2"]
    assert record.attempt == 2
    assert record.retry_attempt == 0
    assert record.worker == worker.name
    assert path(jobbers, result.id) == (
        PUBLISH + START + FAIL + [(S.FAILED.value, S.SUBMITTED.value)] + START + COMPLETE)
    resubmitted = transitions(jobbers, result.id, S.SUBMITTED)[-1]
    assert resubmitted.reason == "resubmitted (retry count reset)"
    assert resubmitted.at >= failed.completed_at
    assert record.retried_at is not None
    assert record.retried_at > record.started_at
    assert sum(jobbers.store.client.zcard(k.publishing)
               for k in jobbers.store.shards.keys) == 0

    # Completed and unknown ids are not resubmitted.
    assert jobbers.resubmit([result.id]) == []
    assert jobbers.resubmit(["no-such-task"]) == []
    assert jobbers.get("no-such-task") is None
    assert jobbers.get(result.id).state == S.COMPLETED
    assert client.llen(key) == 2


def test_retries_and_resubmits_stay_on_the_tasks_queue(proj, worker_factory):
    # The worker consumes only "other": a retry or resubmit routed elsewhere never runs.
    lifecycle_cases.retries_and_resubmits_stay_on_the_tasks_queue(proj, worker_factory)


def test_resubmit_dead_letters_carries_the_entry(proj, worker_factory):
    """From a dead-letter entry: with the record still there (failed -> submitted), and
    after the record was purged (created again as submitted); racing callers publish once."""
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool="prefork", concurrency=2)
    kept, purged = unique("dl-kept"), unique("dl-purged")
    first = proj.fail_once.delay(kept)
    second = proj.fail_once.delay(purged)
    for result in (first, second):
        wait_state(jobbers, result.id, S.FAILED, worker=worker)
    entries = {e.task_id: e for e in (wait_for(lambda r=r: dead_letters(jobbers, r.id),
                                                timeout=5, message="dead letter")[0]
                                       for r in (first, second))}
    assert jobbers.store.remove_terminal([second.id]) == 1
    assert jobbers.get(second.id) is None

    # Both entries, twice each, from two threads: each task is published once.
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: jobbers.resubmit_dead_letters(
            [entries[first.id], entries[second.id]], reset_retry_count=False), range(4)))
    published = sorted(i for run in runs for i in run)
    assert published == sorted([first.id, second.id])
    for result, key in ((first, kept), (second, purged)):
        record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
        assert client.lrange(key, 0, -1)[-1] == str(record.attempt)
        assert record.version == entries[result.id].version
        assert transitions(jobbers, result.id, S.SUBMITTED)[-1].reason == (
            "resubmitted from the dead-letter queue")
    assert sum(jobbers.store.client.zcard(k.publishing)
               for k in jobbers.store.shards.keys) == 0
    assert jobbers.resubmit_dead_letters([entries[first.id]]) == []
