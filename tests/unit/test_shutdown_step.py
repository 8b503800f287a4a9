"""ShutdownStep keeps the worker's event loop from sleeping long: Celery notices a shutdown
signal only at the loop's next pass, and an idle loop on an amqp:// broker slept until its
next timer (up to 10 s). Checked end to end in tests/integration/test_on_rabbitmq.py."""

from __future__ import annotations

from types import SimpleNamespace

from kombu.asynchronous import Hub

from jobbers_celery.runtime import ShutdownStep
from jobbers_celery.shutdown import WAKE_UP_S


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
