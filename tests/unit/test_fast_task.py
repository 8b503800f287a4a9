"""A JobbersTask's outcome decisions, through its public behaviour on the in-memory fakes
(one embedded worker on the memory broker for the module, no Redis): a return completes, an
unexpected error fails at once and is dead-lettered, an expected one is retried while
retries are left and then fails, a cancellation honoured at a heartbeat cancels, a task
that does not save dead letters leaves none, and the checkpoint reaches the next attempt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from jobbers_celery import JobbersTask, RateLimit, TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.testing import (
    InMemoryDeadLetterSink,
    InMemoryStore,
    embedded_worker,
    in_memory,
)
from tests.conftest import wait_for

S = TaskState
app = Celery("fast_task", broker="memory://", backend="cache+memory://")
app.conf.broker_transport_options = {"polling_interval": 0.01}


class Unavailable(Exception):
    pass


@app.task(base=JobbersTask, bind=True, name="fast.work", max_retries=2, retry_delay=0,
          expected_exceptions=(Unavailable,), dead_letter_policy="save", shared=False)
def work(self: JobbersTask, fail_times: int, unexpected: bool = False) -> int:
    self.heartbeat(checkpoint=(self.checkpoint or 0) + 1)
    if unexpected:
        raise KeyError("bug")
    if self.request.retries < fail_times:
        raise Unavailable(f"attempt {self.attempt}")
    return int(self.checkpoint or 0)


@app.task(base=JobbersTask, bind=True, name="fast.quiet", dead_letter_policy="none",
          shared=False)
def quiet(self: JobbersTask) -> None:
    raise KeyError("bug")


@app.task(base=JobbersTask, bind=True, name="fast.loop", shared=False)
def loop(self: JobbersTask) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # bounded: stops at a heartbeat once cancelled
        self.heartbeat()
        time.sleep(0.01)


@app.task(base=JobbersTask, name="fast.rated", rate_limit_by=RateLimit("50/s", on="account"),
          expected_exceptions=(ValueError,), dead_letter_policy="save", shared=False)
def rated(account: str) -> str:
    return account


@app.task(base=JobbersTask, name="fast.fair", max_concurrent=1, concurrency_key="account",
          dead_letter_policy="save", shared=False)
def fair(account: str) -> str:
    return account


@pytest.fixture(scope="module")
def jobbers() -> Iterator[Jobbers]:
    jobbers = in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())
    with embedded_worker(app, shutdown_timeout=30):
        yield jobbers



def _ends(jobbers: Jobbers, task_id: str, state: TaskState) -> list[TaskState]:
    def ended() -> bool:
        record = jobbers.get(task_id)
        return record is not None and record.state is state
    wait_for(ended)
    return [t.to_state for t in jobbers.history(task_id)]


def _sink(jobbers: Jobbers) -> InMemoryDeadLetterSink:
    assert isinstance(jobbers.sink, InMemoryDeadLetterSink)
    return jobbers.sink


def test_a_return_completes(jobbers: Jobbers) -> None:
    result: Any = work.delay(0)
    assert _ends(jobbers, result.id, S.COMPLETED) == [S.SUBMITTED, S.STARTED, S.COMPLETED]
    assert _sink(jobbers).of(result.id) == []


def test_an_unexpected_error_fails_at_once_and_is_dead_lettered(jobbers: Jobbers) -> None:
    result: Any = work.delay(0, unexpected=True)
    assert _ends(jobbers, result.id, S.FAILED).count(S.STARTED) == 1  # no retry
    [entry] = wait_for(lambda: _sink(jobbers).of(result.id))
    assert (entry.attempt, entry.exception_type) == (1, "KeyError")


def test_an_expected_error_is_retried_and_the_checkpoint_carried(jobbers: Jobbers) -> None:
    result: Any = work.delay(1)
    assert _ends(jobbers, result.id, S.COMPLETED).count(S.STARTED) == 2
    record = jobbers.get(result.id)
    assert record is not None
    assert record.checkpoint == 2  # the second attempt saw the first one's
    assert _sink(jobbers).of(result.id) == []


def test_an_expected_error_out_of_retries_fails_and_is_dead_lettered(jobbers: Jobbers
                                                                      ) -> None:
    result: Any = work.delay(5)
    assert _ends(jobbers, result.id, S.FAILED).count(S.STARTED) == 3  # two retries
    [entry] = wait_for(lambda: _sink(jobbers).of(result.id))
    assert entry.attempt == 3
    assert entry.exception_type is not None
    assert entry.exception_type.endswith("Unavailable")


def test_a_task_that_drops_dead_letters_leaves_none(jobbers: Jobbers) -> None:
    result: Any = quiet.delay()
    _ends(jobbers, result.id, S.FAILED)
    assert _sink(jobbers).of(result.id) == []


def test_a_cancellation_is_honoured_at_the_next_heartbeat(jobbers: Jobbers) -> None:
    result: Any = loop.delay()
    _ends(jobbers, result.id, S.STARTED)
    assert jobbers.cancel(result.id)
    assert _ends(jobbers, result.id, S.CANCELLED)[-1] is S.CANCELLED
    assert _sink(jobbers).of(result.id) == []


@pytest.mark.parametrize("task", [rated, fair], ids=["rate_limit_by", "concurrency_key"])
def test_a_call_without_a_key_fails_without_running(jobbers: Jobbers, task: Any) -> None:
    """Its arguments give no key for the control the task declares: it neither runs outside
    the control nor waits; it fails at once with the key error (no retry, even though the
    error is a ValueError and the task retries those), dead-lettered; Celery's result says
    the same. A call with its key runs."""
    keyless: Any = app.send_task(task.name, kwargs={"other": 1})
    assert _ends(jobbers, keyless.id, S.FAILED) == [S.SUBMITTED, S.STARTED, S.FAILED]
    reason = jobbers.history(keyless.id)[-1].reason or ""
    assert reason.startswith("not run: ")
    assert "'account'" in reason
    [entry] = wait_for(lambda: _sink(jobbers).of(keyless.id))
    assert entry.exception_type is not None
    assert entry.exception_type.endswith("KeyError")
    with pytest.raises(ValueError, match="account"):
        keyless.get(timeout=10)
    keyed: Any = task.delay("acct-1")
    assert _ends(jobbers, keyed.id, S.COMPLETED)[-1] is S.COMPLETED
    assert keyed.get(timeout=10) == "acct-1"
