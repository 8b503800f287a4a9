"""Celery's soft time limit (SIGUSR1 on prefork) never interrupts a lifecycle step.

Runs the task in this process's main thread, as a prefork child does, with a SIGUSR1
handler that raises ``SoftTimeLimitExceeded`` like billiard's, and delivers the signal in the
middle of a step.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid

import pytest
from celery.exceptions import Retry, SoftTimeLimitExceeded

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.core.states import TaskState as S
from jobbers_celery.store import steps

pytestmark = pytest.mark.redis


# "alone" needs a process with no other thread: a pytest-xdist worker has one (execnet's,
# unknown to ``threading``) that the kernel may hand the signal to (scripts/test: serial)
@pytest.fixture(params=[pytest.param("alone", marks=pytest.mark.serial), "beside_a_thread"])
def soft_limit_handler(request):
    """billiard's handler; the main thread alone, or beside another thread (an exporter's,
    say) that does not block the signal, so the kernel may hand the signal to it and Python
    runs the handler in the main thread whatever its mask."""
    def raise_soft_limit(signum, frame):
        raise SoftTimeLimitExceeded()

    old = signal.signal(signal.SIGUSR1, raise_soft_limit)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    if request.param == "beside_a_thread":
        other.start()
    yield
    stop.set()
    if other.is_alive():
        other.join(5)
    signal.signal(signal.SIGUSR1, old)


@pytest.fixture
def task(proj):
    if "test.softlimit" not in proj.app.tasks:
        @proj.app.task(base=JobbersTask, bind=True, name="test.softlimit", timeout=30,
                       max_retries=3)
        def softlimit_task(self):
            return "body done"

        @proj.app.task(base=JobbersTask, bind=True, name="test.softlimit_retry",
                       max_retries=3, retry_delay=60, expected_exceptions=(KeyError,))
        def failing(self):
            raise KeyError("upstream")

    return proj.app.tasks["test.softlimit"]


def _signal_during(store, monkeypatch, to_state):
    original = steps._run  # every kind of step goes through it

    def run(s, task_id, to, *args):
        if to is to_state:
            os.kill(os.getpid(), signal.SIGUSR1)  # the limit fires mid-step
        return original(s, task_id, to, *args)

    monkeypatch.setattr(steps, "_run", run)


def _run(proj, task):
    task_id = str(uuid.uuid4())
    task.apply_async(task_id=task_id)  # records submitted; no worker consumes it
    task.push_request(id=task_id, hostname="test@localhost", args=(), kwargs={}, retries=0,
                      called_directly=False, is_eager=False,
                      delivery_info={"exchange": "", "routing_key": "celery"})
    try:
        return task_id, task()
    finally:
        task.publish_retry()  # what task_postrun does once Celery's tracer stored RETRY
        task.pop_request()


def test_limit_during_the_start_step_interrupts_the_body_and_retries(
        proj, task, soft_limit_handler, monkeypatch):
    _signal_during(proj.jobbers.store, monkeypatch, S.STARTED)
    with pytest.raises(Retry):
        _run(proj, task)
    records = proj.jobbers.tasks(name="test.softlimit")
    assert len(records) == 1
    history = proj.jobbers.history(records[0].task_id)
    assert [t.to_state for t in history] == [
        S.SUBMITTED, S.STARTED, S.UNSUBMITTED, S.SUBMITTED]  # retried, published again
    assert records[0].error is not None
    assert records[0].error.type == "jobbers_celery.core.errors.TaskTimeout"


def test_limit_during_the_completed_step_is_dropped_after_the_body_finished(
        proj, task, soft_limit_handler, monkeypatch):
    _signal_during(proj.jobbers.store, monkeypatch, S.COMPLETED)
    task_id, result = _run(proj, task)
    assert result == "body done"
    assert proj.jobbers.get(task_id).state == TaskState.COMPLETED
    assert signal.SIGUSR1 not in signal.sigpending()
    assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_limit_during_retry_bookkeeping_does_not_lose_the_retry(
        proj, task, soft_limit_handler, monkeypatch):
    failing = proj.app.tasks["test.softlimit_retry"]
    _signal_during(proj.jobbers.store, monkeypatch, S.SCHEDULED)
    with pytest.raises(Retry):
        _run(proj, failing)
    (record,) = proj.jobbers.tasks(name="test.softlimit_retry")
    assert record.state == TaskState.SCHEDULED
    assert record.run_at is not None
