"""A JobbersTask behaves as a plain ``celery.Task`` for the caller, and its record tells what
happened: each case runs the same body once as a plain task and once as a JobbersTask on
one embedded worker (memory broker, the in-memory store, no Redis) and compares what
Celery shows (the result's state, the exception the worker reports); then reads the record.

- ``self.retry()`` without ``countdown``/``eta`` waits ``default_retry_delay`` (Celery's
  180 s unless set) when the task sets no ``retry_delay``; jobbers' own retries of
  ``expected_exceptions`` still go out at once; ``autoretry_for`` with ``retry_backoff``
  waits the countdown Celery computes.
- ``MaxRetriesExceededError`` reads as Celery's (``args:('k',)``) and carries
  ``task_args``/``task_kwargs``.
- ``Ignore`` raised by the body ends the attempt ``completed`` ("ended by Ignore"); a bare
  ``Retry`` raised by the body (no new message) ends it ``failed``; neither is left
  ``started`` (later a false stall).
- ``self.replace(sig)``: the caller gets the replacement's result; the record follows the
  id to the replacement (tests/integration/test_task_endings.py: chains, groups, pools).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery, Task
from celery.exceptions import Ignore, MaxRetriesExceededError, Retry
from celery.signals import task_failure

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, embedded_worker, in_memory
from tests.conftest import wait_for

S = TaskState
app = Celery("task_parity", broker="memory://", backend="cache+memory://")
app.conf.broker_transport_options = {"polling_interval": 0.01}

#: How many times each (kind, id) ran: a retry that waits must not have run again.
runs: dict[str, int] = {}
#: The exception object each failed task id reported (the worker's task_failure signal).
failures: dict[str, BaseException] = {}


def _count(task_id: str) -> int:
    runs[task_id] = runs.get(task_id, 0) + 1
    return runs[task_id]


class Unavailable(Exception):
    pass


def _bases() -> list[type[Task]]:  # type: ignore[type-arg]
    return [Task, JobbersTask]


def _define(base: type[Task], kind: str) -> dict[str, Any]:  # type: ignore[type-arg]
    """The same bodies on ``base``, named ``<kind>.<what>``."""
    opts: dict[str, Any] = {"base": base, "bind": True, "shared": False}

    @app.task(name=f"{kind}.retry_plain", max_retries=3, **opts)
    def retry_plain(self: Task) -> str:  # type: ignore[type-arg]
        _count(self.request.id)
        raise self.retry(exc=Unavailable("down"))

    @app.task(name=f"{kind}.out_of_retries", max_retries=0, **opts)
    def out_of_retries(self: Task, key: str, flag: bool = True) -> None:  # type: ignore[type-arg]
        raise self.retry()

    @app.task(name=f"{kind}.backoff", autoretry_for=(Unavailable,), retry_backoff=True,
              retry_jitter=False, max_retries=2, **opts)
    def backoff(self: Task) -> float:  # type: ignore[type-arg]
        if _count(self.request.id) == 1:
            runs[self.request.id + ":first"] = int(time.monotonic() * 1000)
            raise Unavailable("down")
        return time.monotonic() - runs[self.request.id + ":first"] / 1000

    @app.task(name=f"{kind}.ignored", **opts)
    def ignored(self: Task) -> None:  # type: ignore[type-arg]
        self.update_state(state="PROGRESS", meta={"done": 1})
        raise Ignore()

    @app.task(name=f"{kind}.bare_retry", dead_letter_policy="save", **opts)
    def bare_retry(self: Task) -> None:  # type: ignore[type-arg]
        _count(self.request.id)
        raise Retry()

    @app.task(name=f"{kind}.add", **opts)
    def add(self: Task, x: int, y: int) -> int:  # type: ignore[type-arg]
        return x + y

    @app.task(name=f"{kind}.replaced", **opts)
    def replaced(self: Task, x: int) -> Any:  # type: ignore[type-arg]
        return self.replace(add.s(x, 100))

    return {"retry_plain": retry_plain, "out_of_retries": out_of_retries, "backoff": backoff,
            "ignored": ignored, "bare_retry": bare_retry, "add": add, "replaced": replaced}


PLAIN = _define(Task, "plain")
JOBBERS = _define(JobbersTask, "jobbers")


@app.task(base=JobbersTask, bind=True, name="jobbers.expected", shared=False,
          expected_exceptions=(Unavailable,), max_retries=2)
def expected(self: JobbersTask) -> int:
    if _count(self.request.id) == 1:
        raise Unavailable("down")
    return self.attempt


@task_failure.connect
def _failed(sender: Any = None, task_id: str | None = None, exception: Any = None,
            **_: Any) -> None:
    if task_id:
        failures[task_id] = exception


@pytest.fixture(scope="module")
def jobbers() -> Iterator[Jobbers]:
    jobbers = in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())
    with embedded_worker(app, shutdown_timeout=30):
        yield jobbers


def _sink(jobbers: Jobbers) -> InMemoryDeadLetterSink:
    assert isinstance(jobbers.sink, InMemoryDeadLetterSink)
    return jobbers.sink


def _record_state(jobbers: Jobbers, task_id: str, state: TaskState) -> Any:
    def reached() -> Any:
        record = jobbers.get(task_id)
        return record if record is not None and record.state is state else None
    return wait_for(reached, message=f"{task_id} {state}")


# ---------------------------------------------------------------- default_retry_delay
@pytest.mark.parametrize("tasks", [PLAIN, JOBBERS], ids=["plain", "jobbers"])
def test_retry_without_countdown_waits_default_retry_delay(jobbers: Jobbers,
                                                           tasks: dict[str, Any]) -> None:
    result: Any = tasks["retry_plain"].delay()
    wait_for(lambda: result.state == "RETRY", message="RETRY")
    time.sleep(0.5)  # a retry at once would have run again by now
    assert runs[result.id] == 1
    if tasks is JOBBERS:
        record = _record_state(jobbers, result.id, S.SCHEDULED)
        wait = (record.run_at - datetime.now(UTC)).total_seconds()
        assert 170 < wait <= 180  # Celery's default_retry_delay: 3 minutes
        assert jobbers.history(result.id)[-1].reason == "retry 1 of 3"
    result.revoke()


def test_jobbers_own_retry_of_an_expected_exception_goes_out_at_once(jobbers: Jobbers
                                                                      ) -> None:
    result: Any = expected.delay()
    assert result.get(timeout=10) == 2
    history = [t.to_state for t in jobbers.history(result.id)]
    assert S.SCHEDULED not in history  # no default_retry_delay: re-queued at once
    assert history[-1] is S.COMPLETED


@pytest.mark.parametrize("tasks", [PLAIN, JOBBERS], ids=["plain", "jobbers"])
def test_autoretry_backoff_waits_celerys_countdown(jobbers: Jobbers,
                                                   tasks: dict[str, Any]) -> None:
    result: Any = tasks["backoff"].delay()
    waited = result.get(timeout=15)
    assert 0.9 <= waited < 5  # retry_backoff=True, no jitter: 1 s before the first retry
    if tasks is JOBBERS:
        assert S.SCHEDULED in [t.to_state for t in jobbers.history(result.id)]


# ---------------------------------------------------------------- MaxRetriesExceededError
def test_max_retries_exceeded_reads_as_celerys(jobbers: Jobbers) -> None:
    seen: dict[str, tuple[str, Any, Any, str]] = {}
    for kind, tasks in (("plain", PLAIN), ("jobbers", JOBBERS)):
        result: Any = tasks["out_of_retries"].delay("k", flag=False)
        with pytest.raises(MaxRetriesExceededError) as caught:
            result.get(timeout=10)
        exc = wait_for(lambda r=result: failures.get(r.id))
        assert isinstance(exc, MaxRetriesExceededError)
        seen[kind] = (str(exc).replace(result.id, "<id>").replace(kind, "<kind>"),
                      exc.task_args, exc.task_kwargs,
                      str(caught.value).replace(result.id, "<id>").replace(kind, "<kind>"))
    assert seen["jobbers"] == seen["plain"]
    assert seen["plain"][0] == "Can't retry <kind>.out_of_retries[<id>] args:('k',) " \
                               "kwargs:{'flag': False}"
    assert seen["plain"][1:3] == (("k",), {"flag": False})


# ---------------------------------------------------------------- Ignore, bare Retry
@pytest.mark.parametrize("tasks", [PLAIN, JOBBERS], ids=["plain", "jobbers"])
def test_ignore_from_the_body_ends_the_attempt(jobbers: Jobbers, tasks: dict[str, Any]
                                               ) -> None:
    result: Any = tasks["ignored"].delay()
    wait_for(lambda: result.state == "PROGRESS", message="PROGRESS")  # what it stored
    if tasks is JOBBERS:
        _record_state(jobbers, result.id, S.COMPLETED)
        last = jobbers.history(result.id)[-1]
        assert (last.from_state, last.reason) == (
            S.STARTED, "ended by Ignore (Celery stores no result)")
    time.sleep(0.3)
    assert result.state == "PROGRESS"  # Celery stored nothing over it
    assert result.info == {"done": 1}


@pytest.mark.parametrize("tasks", [PLAIN, JOBBERS], ids=["plain", "jobbers"])
def test_a_bare_retry_from_the_body_fails_the_attempt(jobbers: Jobbers,
                                                      tasks: dict[str, Any]) -> None:
    result: Any = tasks["bare_retry"].delay()
    wait_for(lambda: result.state == "RETRY", message="RETRY")
    if tasks is JOBBERS:
        record = _record_state(jobbers, result.id, S.FAILED)
        assert jobbers.history(result.id)[-1].reason == (
            "raised Retry without sending a new message: nothing runs it again")
        assert record.error is not None
        [entry] = wait_for(lambda: _sink(jobbers).of(result.id))  # policy: save
        assert entry.attempt == 1
    time.sleep(0.3)
    assert runs[result.id] == 1  # nothing ran it again
    assert result.state == "RETRY"


# ---------------------------------------------------------------- replace
@pytest.mark.parametrize("tasks", [PLAIN, JOBBERS], ids=["plain", "jobbers"])
def test_replace_gives_the_replacements_result(jobbers: Jobbers, tasks: dict[str, Any]
                                               ) -> None:
    result: Any = tasks["replaced"].delay(1)
    assert result.get(timeout=10) == 101
    if tasks is JOBBERS:
        record = _record_state(jobbers, result.id, S.COMPLETED)
        assert record.name == "jobbers.add"
        steps = [(t.to_state, t.reason) for t in jobbers.history(result.id)]
        assert (S.UNSUBMITTED, "replaced by jobbers.add") in steps
        assert [s for s, _ in steps] == [S.SUBMITTED, S.STARTED, S.UNSUBMITTED, S.SUBMITTED,
                                         S.STARTED, S.COMPLETED]


@pytest.mark.parametrize("tasks", [PLAIN, JOBBERS], ids=["plain", "jobbers"])
def test_replace_in_apply_is_celerys(jobbers: Jobbers, tasks: dict[str, Any]) -> None:
    result: Any = tasks["replaced"].apply(args=(1,))  # eager: sig.apply().get()
    assert (result.get(), result.state) == (101, "SUCCESS")
    assert jobbers.get(result.id) is None  # apply() records nothing


# ---------------------------------------------------------------- refusals
def test_a_second_report_of_an_ended_attempt_is_no_warning(jobbers: Jobbers,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    """Celery reports a hard time limit twice and a Reject(requeue=False) the task recorded
    itself: the refused report is routine (debug); a report refused for another reason
    (another worker runs the attempt) is still a warning."""
    ended: Any = JOBBERS["bare_retry"].delay()
    _record_state(jobbers, ended.id, S.FAILED)
    store = jobbers.store
    running = str(uuid.uuid4())
    store.step(running, S.SUBMITTED, create={"name": "jobbers.add", "queue": "celery"},
               reason="published")
    store.step(running, S.STARTED, start=True, wid="w-other")
    with caplog.at_level(logging.DEBUG, logger="jobbers"):
        for task_id in (ended.id, running):
            res = jobbers.recorder.fail_reported(
                task_id, "jobbers.add", wid="w-this", exc=RuntimeError("lost"), traceback=None,
                worker=None, enqueued_ms=None, dead_letter=False)
            assert not res.applied
    refused = {(r.levelno, r.getMessage().split(" of task ")[1].split()[0])
               for r in caplog.records if "refused transition" in r.getMessage()}
    assert refused == {(logging.DEBUG, ended.id), (logging.WARNING, running)}


def test_a_failure_in_apply_records_nothing_and_refuses_nothing(
        jobbers: Jobbers, caplog: pytest.LogCaptureFixture) -> None:
    """A task run in the caller (``apply()``, eager) that fails: Celery sends
    ``task_failure`` there too; nothing was recorded, so nothing is ended (it logged a
    refused ``missing -> failed`` for every eager failure)."""
    with caplog.at_level(logging.DEBUG, logger="jobbers"):
        result: Any = JOBBERS["add"].apply(args=("x", 1))  # str + int: TypeError
    assert result.state == "FAILURE"
    assert jobbers.get(result.id) is None
    assert not [r for r in caplog.records if "refused transition" in r.getMessage()]
