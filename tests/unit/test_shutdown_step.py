"""ShutdownStep keeps the worker's event loop from sleeping long: Celery notices a shutdown
signal only at the loop's next pass, and an idle loop on an amqp:// broker slept until its
next timer (up to 10 s). Checked end to end in tests/integration/test_on_rabbitmq.py. It
interrupts a task without marking its request done: the worker counts the task as running
until its child returns."""

from __future__ import annotations

import signal
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state
from kombu.asynchronous import Hub

from jobbers_celery import JobbersTask
from jobbers_celery.worker import shutdown
from jobbers_celery.worker.runtime import ShutdownStep
from jobbers_celery.worker.shutdown import WAKE_UP_S


def test_the_step_keeps_a_wake_up_timer_in_the_event_loop_while_it_runs() -> None:
    hub = Hub()
    try:
        worker = SimpleNamespace(hub=hub)
        step = ShutdownStep(worker)
        step.start(worker)
        [entry] = [e for e in hub.timer.queue]
        assert entry.entry.fun.__name__ == "_wake_up"
        # the loop's poll timeout: the next timer is at most WAKE_UP_S away
        assert hub.fire_timers(min_delay=10, max_delay=10) <= WAKE_UP_S
        step.stop(worker)
        assert all(e.entry.canceled for e in hub.timer.queue)
    finally:
        hub.close()


def test_without_an_event_loop_there_is_nothing_to_wake() -> None:
    worker = SimpleNamespace(hub=None)
    step = ShutdownStep(worker)
    step.start(worker)
    step.stop(worker)


class _Pool:
    def __init__(self) -> None:
        self.signalled: list[tuple[int, int]] = []

    def terminate_job(self, pid: int, sig: int) -> None:
        self.signalled.append((pid, sig))


class _Request:
    """The parts of Celery's ``Request`` the step uses; ``cancel()`` must not be called
    (it marks the request done at once)."""

    _already_cancelled = False

    def __init__(self, task: Any) -> None:
        self.task, self.id, self.name = task, "t1", "proj.add"
        self.time_start, self.worker_pid = 1.0, 4242
        self.events: list[str] = []

    def send_event(self, kind: str) -> None:
        self.events.append(kind)

    def cancel(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("Request.cancel() marks the request done")


def test_a_task_interrupted_at_shutdown_still_counts_as_running_until_it_returns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Task(JobbersTask):
        name = "proj.add"

    request = _Request(Task())
    monkeypatch.setattr(state, "active_requests", {request})
    monkeypatch.setattr(shutdown, "_draining", threading.Event())  # close() sets it
    pool = _Pool()
    worker = SimpleNamespace(hub=None, pool=pool)
    ShutdownStep(worker).close(worker)
    assert pool.signalled == [(4242, signal.SIGTERM)]
    assert request in state.active_requests  # the liveness refresh still sees it running
    assert request._already_cancelled  # as after cancel(): a child killed by it is not lost
    assert request.events == ["task-cancelled"]
