"""Resubmitting from the records (``Jobbers.resubmit``) on the in-memory fakes: a task that
failed goes out again (a new run, the retry count reset or kept), one that is pending,
running or completed is not, an id asked twice goes out once, a record whose arguments
were not recorded as JSON is dropped (not resubmitted), and a publish that fails leaves
its lease for a scheduler.
(The dead-letter path: tests/unit/test_resubmit.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from jobbers_celery import TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory

S = TaskState
MSG = '{"args": [1], "kwargs": {}, "options": {"queue": "q"}}'


class Published:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, int, bool]] = []
        self.fail = fail

    def __call__(self, task_id: str, name: str, data: Any, retries: int, now_ms: int,
                 **kw: Any) -> None:
        if self.fail:
            raise ConnectionError("broker away")
        self.calls.append((task_id, retries, kw["resubmit"]))


@pytest.fixture
def jobbers() -> Jobbers:
    jobbers = in_memory(Celery("fast_resubmit", broker="memory://"), InMemoryStore(),
                        InMemoryDeadLetterSink())
    store = _store(jobbers)
    for task_id, end, msg in (("failed", S.FAILED, MSG), ("done", S.COMPLETED, MSG),
                              ("bare", S.FAILED, '{"unserializable": "a socket"}')):
        store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name="app.add",
                     create={"name": "app.add", "queue": "q"},
                     fields={"msg": msg, "retries": "2"})
        started = store.start(task_id, name="app.add", worker=None, wid="w:1",
                              heartbeat_ms=None, cap=None, lease_cap_ms=60_000,
                              defer_ms=1000, fields={})
        store.end(task_id, end, fence=started.attempt, wid="w:1", name="app.add",
                  worker=None, reason="end")
    return jobbers


def _store(jobbers: Jobbers) -> InMemoryStore:
    store = jobbers.store
    assert isinstance(store, InMemoryStore)
    return store


def _state(jobbers: Jobbers, task_id: str) -> TaskState | None:
    record = jobbers.get(task_id)
    return record.state if record else None


def test_a_failed_task_goes_out_again_once_and_a_completed_one_not(
        jobbers: Jobbers, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = Published()
    monkeypatch.setattr(jobbers.publisher, "republish", sent)
    assert jobbers.resubmit(["failed", "done", "failed"]) == ["failed"]
    assert sent.calls == [("failed", 0, True)]  # the retry count reset
    assert (_state(jobbers, "failed"), _state(jobbers, "done")) == (S.SUBMITTED, S.COMPLETED)
    assert "resubmitted" in (jobbers.history("failed")[-1].reason or "")
    assert _store(jobbers).publishing() == {}  # published: the lease confirmed
    assert jobbers.resubmit(["failed"]) == []  # pending now: not again


def test_the_retry_count_is_kept_when_asked(jobbers: Jobbers,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sent = Published()
    monkeypatch.setattr(jobbers.publisher, "republish", sent)
    assert jobbers.resubmit(["failed"], reset_retry_count=False) == ["failed"]
    assert sent.calls == [("failed", 2, True)]


def test_a_record_without_json_arguments_is_settled_as_not_resubmitted(
        jobbers: Jobbers, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = Published()
    monkeypatch.setattr(jobbers.publisher, "republish", sent)
    assert jobbers.resubmit(["bare"]) == []
    assert sent.calls == []
    assert _state(jobbers, "bare") is S.DROPPED
    assert "not recorded as JSON" in (jobbers.history("bare")[-1].reason or "")
    assert _store(jobbers).publishing() == {}


def test_a_failed_publish_leaves_its_lease_for_a_scheduler(
        jobbers: Jobbers, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobbers.publisher, "republish", Published(fail=True))
    assert jobbers.resubmit(["failed"]) == []
    assert _state(jobbers, "failed") is S.SUBMITTED
    assert list(_store(jobbers).publishing()) == ["failed"]


def test_a_payload_dropped_since_the_read_is_taken_from_the_dead_letter(
        jobbers: Jobbers, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record dropped its payload (its dead letter now holds it) after the resubmit
    looked and before its step: the step is refused ``no_msg`` atomically, and the task
    goes out with the entry's payload, never with no arguments (a chord member once ran
    with none that way)."""
    from jobbers_celery import DeadLetter
    from jobbers_celery.core.records import from_ms

    record = _store(jobbers)._records["failed"]
    entry = DeadLetter(
        task_id="failed", name="app.add", version=None, queue="q", reason="failed",
        args=[7], kwargs={"k": 1}, exception_type="ValueError", exception_message="x",
        traceback=None, attempt=int(record["attempt"]), retry_attempt=2, worker=None,
        failed_at=from_ms(1_700_000_000_000), options={"queue": "q"})
    monkeypatch.setattr(jobbers.resubmitter, "entry",
                        lambda task_id, attempt: entry if attempt == entry.attempt else None)
    monkeypatch.setattr(_store(jobbers), "without_payload",
                        lambda ids: record.pop("msg") and {})  # dropped right after the read
    sent: list[Any] = []
    monkeypatch.setattr(jobbers.publisher, "republish",
                        lambda task_id, name, data, *a, **kw: sent.append(data))
    assert jobbers.resubmit(["failed"]) == ["failed"]
    assert [(d["args"], d["kwargs"]) for d in sent] == [([7], {"k": 1})]
    assert _state(jobbers, "failed") is S.SUBMITTED
    assert '"args": [7]' in _store(jobbers)._records["failed"]["msg"]  # kept for a republish
