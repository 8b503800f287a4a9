"""The worker runtime: what jobbers adds to a Celery worker, and nothing else does.

``install(app)`` adds two bootsteps to the app's workers:

- :class:`WorkerStep` starts, once the pool has forked its children, two background
  threads in the worker's main process, both :class:`Periodic`: the scheduler
  (:class:`~jobbers_celery.lifecycle.scheduler.Scheduler`, delayed retries, housekeeping, catch-up
  cleaner passes) and the liveness refresh (:class:`~jobbers_celery.lifecycle.liveness.Liveness`).
  The scheduler stops with the bootsteps; the liveness thread only at ``worker_shutdown``,
  once the pool has drained, so that tasks finishing during a warm shutdown keep their
  worker alive in the cleaner's eyes.
- :class:`ShutdownStep` applies the ``on_shutdown`` policies (see
  :mod:`jobbers_celery.worker.shutdown`) when a prefork worker shuts down.

The fork hook (a pool child must not be forked while a scheduler pass holds locks) is
registered when the first such thread starts in a worker, not when this module is imported:
a process that only publishes never gets it.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from celery import bootsteps, signals

from jobbers_celery.core.options import ShutdownPolicy
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import liveness
from jobbers_celery.lifecycle.emptied import EmptiedWatch
from jobbers_celery.lifecycle.scheduler import Scheduler
from jobbers_celery.store import is_outage
from jobbers_celery.worker.outage import LoopOutage, write_probe
from jobbers_celery.worker.shutdown import WAKE_UP_S, drain, interrupt
from jobbers_celery.worker.task import JobbersTask

__all__ = ["Periodic", "ShutdownStep", "WorkerStep", "liveness_thread",
           "scheduler_thread"]

#: The shutdown step logs as the rest of the shutdown policies do.
log = escaped_logger("jobbers.shutdown")

#: How long a fork waits for a running pass of a fork-safe thread to end before going ahead.
FORK_WAIT_S = 5.0


class Periodic:
    """A daemon thread that calls ``tick`` again and again until stopped: ``tick`` returns
    the seconds to wait before the next call. A store outage is logged once (see
    :class:`~jobbers_celery.worker.outage.LoopOutage`: with ``probe``, a call that went
    through ends it only once the store takes a write too, since a call may only read), any
    other failure in full; either way the next call comes after ``retry_after`` seconds.
    ``fork_safe``: a fork waits for the current call to end (see :func:`_before_fork`)."""

    def __init__(self, name: str, what: str, logger: logging.Logger,
                 tick: Callable[[], float], retry_after: float, *,
                 fork_safe: bool = False, probe: Callable[[], object] | None = None) -> None:
        self.name = name
        self.what = what
        self.logger = logger
        self.tick = tick
        self.retry_after = retry_after
        self.fork_safe = fork_safe
        self.probe = probe
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pass_lock = threading.Lock()  # held during a call; a fork waits for it
        self._held_for_fork = False

    def _loop(self) -> None:
        outage = LoopOutage(self.logger, self.what, self.probe)
        while not self._stop.is_set():
            try:
                with self._pass_lock:  # the probe is a store call too (see _before_fork)
                    wait = self.tick()
                    outage.passed()
            except Exception as exc:
                if is_outage(exc):  # unreachable, or refusing writes (OOM): an outage
                    outage.failed(exc)
                else:
                    self.logger.exception("%s failed; retrying", self.what)
                wait = self.retry_after
            self._stop.wait(wait)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        if self.fork_safe:
            _watch_forks()
            _fork_safe.add(self)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        _fork_safe.discard(self)


def scheduler_thread(scheduler: Scheduler) -> Periodic:
    """The thread that runs ``scheduler``'s passes (fork-safe; most passes only read, so
    the end of an outage is probed with a write)."""
    interval = scheduler.config.scheduler_interval
    return Periodic("jobbers-scheduler", "jobbers scheduler pass",
                    escaped_logger("jobbers.scheduler"), scheduler.tick,
                    max(interval, 1.0), fork_safe=True, probe=write_probe(scheduler.store))


def liveness_thread(refresher: liveness.Liveness, watch: EmptiedWatch | None = None,
                    probe: Callable[[], object] | None = None) -> Periodic:
    """The thread that refreshes a worker incarnation's liveness (and, with ``watch``,
    notices a store that came back empty; ``probe``: see :class:`Periodic`)."""
    period = liveness.refresh_period(refresher.config.worker_lost_after)

    def tick() -> float:
        refresher.refresh()
        if watch is not None:
            watch.check()
        due = refresher.wake_in()  # a stalled attempt's SIGKILL may come before the period
        return period if due is None else min(period, due)

    return Periodic("jobbers-liveness", "jobbers liveness refresh",
                    escaped_logger("jobbers.liveness"), tick, period, probe=probe)


# ---------------------------------------------------------------------- forks
#: Fork-safe threads running in this process (see ``_before_fork``).
_fork_safe: weakref.WeakSet[Periodic] = weakref.WeakSet()
_fork_hook = threading.Lock()
_fork_hooked = False


def _before_fork() -> None:
    # A prefork child forked while the scheduler thread is inside a Redis call, a publish or
    # an import inherits the locks that thread holds (redis-py pool locks, module import
    # locks) and deadlocks on its first task. Let the current pass end before forking.
    for thread in list(_fork_safe):
        thread._held_for_fork = thread._pass_lock.acquire(timeout=FORK_WAIT_S)


def _after_fork() -> None:
    for thread in list(_fork_safe):
        if thread._held_for_fork:
            thread._held_for_fork = False
            thread._pass_lock.release()


def _watch_forks() -> None:
    """Register the fork hook, once per process (the first fork-safe thread to start)."""
    global _fork_hooked
    with _fork_hook:
        if not _fork_hooked:
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                                after_in_child=_after_fork)
            _fork_hooked = True


# ---------------------------------------------------------------------- bootsteps
class WorkerStep(bootsteps.StartStopStep):
    """Starts the scheduler and the liveness thread with the worker."""

    label = "jobbers scheduler"
    # Start once the pool has forked its children: without this, the step order is left to
    # set iteration (it varies with PYTHONHASHSEED) and prefork children could be forked
    # while the scheduler thread holds locks (see _before_fork).
    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.scheduler: Periodic | None = None
        self.liveness: Periodic | None = None

    def start(self, parent: Any) -> None:
        jobbers = Jobbers.of(parent.app)
        refresher = liveness.Liveness(jobbers.store, jobbers.config, liveness.worker_id(),
                                      getattr(parent, "pool", None),
                                      jobbers.cleaner.recover_orphans)
        watch = EmptiedWatch(jobbers.store, jobbers.alerts.emit, jobbers.config.key_prefix,
                             getattr(parent, "hostname", None) or "")
        self.liveness = liveness_thread(refresher, watch, write_probe(jobbers.store))
        self.liveness.start()
        stop_liveness = self.liveness.stop

        def _on_shutdown(**_: Any) -> None:
            stop_liveness()

        signals.worker_shutdown.connect(_on_shutdown, weak=False,
                                        dispatch_uid=f"jobbers.liveness.{id(self)}")
        scheduler = jobbers.scheduler(getattr(parent, "hostname", None))
        scheduler.fair_shares = any(  # a worker of a concurrency_key task releases its parked
            getattr(getattr(t, "jobbers_options", None), "concurrency_key", None) is not None
            for t in list(jobbers.app.tasks.values()))
        self.scheduler = scheduler_thread(scheduler)
        self.scheduler.start()

    def stop(self, parent: Any) -> None:
        # the liveness thread goes on until ``worker_shutdown``: a warm shutdown stops this
        # step before the pool has finished the tasks it lets run to their end
        if self.scheduler is not None:
            self.scheduler.stop()

    shutdown = stop

    def terminate(self, parent: Any) -> None:
        """A cold stop (``WorkController.terminate``: Celery's embedded test worker, the
        ``celery_worker`` fixture) sends no ``worker_shutdown`` and skips :meth:`stop`: stop
        both threads here, or each stopped worker leaves them running in the process."""
        self.stop(parent)
        if self.liveness is not None:
            self.liveness.stop()


def _wake_up() -> None:
    """A timer that does nothing: the event loop's pass after it checks for shutdown."""


class ShutdownStep(bootsteps.StartStopStep):
    """Interrupts the ``stop`` and ``resubmit`` tasks when a prefork worker shuts down."""

    label = "jobbers shutdown policies"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._wake_up: Any = None

    def start(self, parent: Any) -> None:
        hub = getattr(parent, "hub", None)  # None without an event loop (solo, eventlet)
        if hub is not None:
            self._wake_up = hub.call_repeatedly(WAKE_UP_S, _wake_up)

    def stop(self, parent: Any) -> None:
        if self._wake_up is not None:
            self._wake_up.cancel()
            self._wake_up = None

    def close(self, parent: Any) -> None:
        # blueprint.stop() calls close() on every step before any stop(): the pool has not
        # started to wait for its children yet
        from celery.worker import state

        drain()
        pool = getattr(parent, "pool", None)
        if pool is None:
            return
        for request in list(state.active_requests):
            task = getattr(request, "task", None)
            if not isinstance(task, JobbersTask):
                continue
            if task.jobbers_options.on_shutdown is ShutdownPolicy.CONTINUE:
                continue
            try:
                interrupt(request, pool)
                log.info("shutdown: interrupting %s[%s] (on_shutdown=%s)", request.name,
                         request.id, task.jobbers_options.on_shutdown.value)
            except NotImplementedError:
                return  # threads/solo: the task stops at its next heartbeat instead
            except Exception:
                log.exception("shutdown: could not interrupt %s[%s]", request.name,
                              request.id)
