"""The recorder on the in-memory fakes (no Redis, milliseconds): a publish records the
submission and stamps the message, a start makes the attempt's Run, each attempt end is the
step it names, a failure of a task that saves dead letters reaches the sink (and only then),
and a pending cancellation turns a failure into a cancellation with no dead letter."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from jobbers_celery import TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle.recorder import Recorder, Run
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory

S = TaskState


class Boom(Exception):
    pass


@pytest.fixture
def jobbers() -> Jobbers:
    return in_memory(Celery("fast_recorder", broker="memory://"), InMemoryStore(),
                     InMemoryDeadLetterSink())


def _store(jobbers: Jobbers) -> InMemoryStore:
    store = jobbers.store
    assert isinstance(store, InMemoryStore)
    return store


def _sink(jobbers: Jobbers) -> InMemoryDeadLetterSink:
    sink = jobbers.sink
    assert isinstance(sink, InMemoryDeadLetterSink)
    return sink


def _published(recorder: Recorder, task_id: str = "t1", *, dead_letter: bool = True
               ) -> dict[str, Any]:
    headers: dict[str, Any] = {"id": task_id, "task": "app.add", "retries": 0}
    recorder.publish("app.add", headers, ((1, 2), {"x": 3}, {}), "", "q1",
                     {"delivery_info": {"routing_key": "q1"}}, None, dead_letter)
    return headers


def _run(recorder: Recorder, task_id: str = "t1") -> Run:
    res = recorder.start(task_id, "app.add", worker="w@h", wid="w@h:1:a", heartbeat_ms=None,
                         cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={})
    assert res.state is S.STARTED
    return recorder.running(res, task_id, "app.add", "w@h", "w@h:1:a", None, None)


def test_a_publish_records_the_submission_and_stamps_the_message(jobbers: Jobbers) -> None:
    headers = _published(jobbers.recorder)
    record = _store(jobbers).get("t1")
    assert record is not None
    assert (record.state, record.name) == (S.SUBMITTED, "app.add")
    assert headers[pl.HEADER_EPOCH] == _store(jobbers).epoch("t1")
    assert headers[pl.HEADER_DEAD_LETTER] == 1
    assert headers[pl.HEADER_PUBLISHED_AT] == headers[pl.HEADER_ENQUEUED_AT]


def test_a_start_makes_the_attempts_run_and_a_completion_ends_it(jobbers: Jobbers) -> None:
    recorder = jobbers.recorder
    _published(recorder)
    run = _run(recorder)
    assert (run.attempt, run.wid) == (1, "w@h:1:a")
    res = recorder.complete(run, fields={}, drop=(), write=None)
    assert res.applied
    assert [t.to_state for t in jobbers.history("t1")] == [S.SUBMITTED, S.STARTED, S.COMPLETED]
    assert _sink(jobbers).entries == []


def test_a_failure_is_dead_lettered_into_the_sink(jobbers: Jobbers) -> None:
    recorder = jobbers.recorder
    _published(recorder)
    res = recorder.fail(_run(recorder), Boom("no luck"), reason="raised", fields={},
                        dead_letter=True)
    assert res.state is S.FAILED
    [entry] = _sink(jobbers).of("t1")
    assert (entry.attempt, entry.name, entry.exception_message) == (1, "app.add", "no luck")
    assert entry.exception_type is not None
    assert entry.exception_type.endswith("Boom")
    assert (entry.args, entry.kwargs) == ([1, 2], {"x": 3})


def test_a_failure_of_a_task_without_dead_letters_writes_none(jobbers: Jobbers) -> None:
    recorder = jobbers.recorder
    _published(recorder, dead_letter=False)
    res = recorder.fail(_run(recorder), Boom(), reason="raised", fields={}, dead_letter=False)
    assert res.state is S.FAILED
    assert _sink(jobbers).entries == []


def test_a_pending_cancellation_turns_a_failure_into_a_cancellation(jobbers: Jobbers) -> None:
    recorder = jobbers.recorder
    _published(recorder)
    run = _run(recorder)
    assert jobbers.cancel("t1")
    res = recorder.fail(run, Boom(), reason="raised", fields={}, dead_letter=True)
    assert res.state is S.CANCELLED
    assert _sink(jobbers).entries == []


def test_a_retry_later_waits_in_the_store_until_its_delay(jobbers: Jobbers) -> None:
    recorder = jobbers.recorder
    store = _store(jobbers)
    _published(recorder)
    res = recorder.retry_later(_run(recorder), reason="retry", delay_ms=30_000, fields={},
                               version=None)
    assert res.state is S.SCHEDULED
    assert store.due()[0] == []
    store.advance(31)
    assert store.due()[0] == ["t1"]


def test_an_end_of_a_stale_attempt_is_refused(jobbers: Jobbers) -> None:
    recorder = jobbers.recorder
    _published(recorder)
    run = _run(recorder)
    assert recorder.retry_now(run, reason="again", fields={}, version=None).applied
    res = recorder.complete(run, fields={}, drop=(), write=None)  # the old attempt's
    assert not res.applied
    record = _store(jobbers).get("t1")
    assert record is not None
    assert record.state is S.UNSUBMITTED
