"""The in-worker scheduler: re-publishes delayed retries when their ``run_at`` arrives.

Runs as a thread in every worker's main process (a worker bootstep). A due task is claimed
atomically (``scheduled -> submitted`` plus a publish lease) so several workers never both
publish it; a claim whose publisher died is published again once its lease expires, and the
start step drops the duplicate should both messages arrive. It also retries parked dead
letters, prunes expired terminal records, and runs a catch-up cleaner pass when celery beat
has not run one for three cleaner intervals.

The same worker bootstep starts the worker's liveness thread (see :mod:`liveness`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from celery import bootsteps, signals

from jobbers_celery import liveness, metrics
from jobbers_celery.store import is_outage

if TYPE_CHECKING:
    from jobbers_celery.cleaner import Cleaner
    from jobbers_celery.config import JobbersConfig
    from jobbers_celery.publisher import Publisher
    from jobbers_celery.sinks import DeadLetterDispatcher
    from jobbers_celery.store import Claimed, RedisStore

__all__ = ["Scheduler", "SchedulerStep"]

log = logging.getLogger("jobbers.scheduler")

_BATCH = 500
_HOUSEKEEPING_EVERY_S = 10.0
#: One housekeeping pass prunes for at most this long, then yields to due retries.
_HOUSEKEEPING_BUDGET_S = 1.0
#: How long a fork waits for a running scheduler pass to end before going ahead anyway.
_FORK_WAIT_S = 5.0

#: Schedulers whose thread runs in this process (see ``_before_fork``).
_running: weakref.WeakSet[Scheduler] = weakref.WeakSet()


def _before_fork() -> None:
    # A prefork child forked while the scheduler thread is inside a Redis call, a publish or
    # an import inherits the locks that thread holds (redis-py pool locks, module import
    # locks) and deadlocks on its first task. Let the current pass end before forking.
    for scheduler in list(_running):
        scheduler._held_for_fork = scheduler._pass_lock.acquire(timeout=_FORK_WAIT_S)


def _after_fork() -> None:
    for scheduler in list(_running):
        if scheduler._held_for_fork:
            scheduler._held_for_fork = False
            scheduler._pass_lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                    after_in_child=_after_fork)


class Scheduler:
    """Publishes the due retries of one jobbers namespace, and runs its housekeeping.

    ``dead_letters`` (whose parked entries housekeeping retries) and ``cleaner`` (whose
    catch-up pass it runs when beat runs none) may be left out by a caller that only
    publishes.
    """

    def __init__(self, store: RedisStore, config: JobbersConfig, publisher: Publisher,
                 dead_letters: DeadLetterDispatcher | None = None,
                 cleaner: Cleaner | None = None, worker_name: str | None = None, *,
                 batch: int = _BATCH) -> None:
        self.store = store
        self.config = config
        self.publisher = publisher
        self.dead_letters = dead_letters
        self.cleaner = cleaner
        self.batch = batch
        self.worker_name = worker_name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_housekeeping = 0.0
        self._last_catch_up_check = time.monotonic()
        self._pass_lock = threading.Lock()  # held during a pass; a fork waits for it
        self._held_for_fork = False

    def run_once(self) -> tuple[int, float | None]:
        """Claim and publish what is due. Returns (published, seconds until the next run_at)."""
        store = self.store
        ids, next_ms = store.due(self.batch)
        published = 0
        if ids:
            lease_ms = int(self.config.publish_lease * 1000)
            claimed = store.claim(ids, lease_ms, self.worker_name)
            done = []
            now_ms = store.now_ms()
            for item in claimed:
                if item.run_at is not None:  # claimed because its run_at came
                    metrics.selected(item.name, item.queue, metrics.ROLE_SCHEDULER,
                                     now_ms - item.run_at)
            for item in claimed:
                try:
                    self._publish(item, now_ms)
                    done.append(item.task_id)
                except Exception:
                    log.exception("could not publish due task %s; it will be tried again "
                                  "after its lease", item.task_id)
            store.confirm_published(done)
            published = len(done)
        wait = None
        if next_ms is not None:
            wait = max(0.0, (next_ms - store.now_ms()) / 1000.0)
        return published, wait

    def _publish(self, item: Claimed, now_ms: int) -> None:
        publisher = self.publisher
        publisher.republish(item.task_id, item.name, publisher.payload_of(item.msg),
                            item.retries, now_ms)

    def housekeeping(self) -> int:
        """Retry parked dead letters; prune expired records. Returns records pruned.

        One worker at a time (a short lock; pruning is compare-and-set, so the lock only saves
        duplicate work). Pruning drains in batches until nothing is left or the time budget is
        spent, so index entries never pile up faster than they are removed.
        """
        if self.dead_letters is not None:
            self.dead_letters.retry_pending()
        store = self.store
        if not store.try_lock("housekeeping", int(_HOUSEKEEPING_EVERY_S * 1000)):
            return 0
        pruned, started = 0, time.monotonic()
        while time.monotonic() - started < _HOUSEKEEPING_BUDGET_S:
            n = store.prune()
            pruned += n
            if n == 0:
                break
        return pruned

    def _loop(self) -> None:
        interval = self.config.scheduler_interval
        outage = liveness.OutageLog(log, "jobbers scheduler pass")
        while not self._stop.is_set():
            wait = interval
            try:
                with self._pass_lock:
                    _, next_due = self.run_once()
                    if next_due is not None:
                        wait = min(interval, next_due)
                    if time.monotonic() - self._last_housekeeping > _HOUSEKEEPING_EVERY_S:
                        self._last_housekeeping = time.monotonic()
                        self.housekeeping()
                    every = self.config.cleaner_interval
                    if (self.cleaner is not None
                            and time.monotonic() - self._last_catch_up_check > every):
                        self._last_catch_up_check = time.monotonic()
                        self.cleaner.catch_up(by=f"catch-up in {self.worker_name}")
            except Exception as exc:
                if is_outage(exc):  # unreachable, or refusing writes (OOM): an outage
                    outage.failed(exc)
                else:
                    log.exception("jobbers scheduler pass failed; retrying")
                wait = max(interval, 1.0)
            else:
                outage.succeeded()
            self._stop.wait(wait)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="jobbers-scheduler",
                                        daemon=True)
        _running.add(self)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        _running.discard(self)


class SchedulerStep(bootsteps.StartStopStep):
    """Starts the scheduler and the liveness thread with the worker.

    The scheduler stops with the bootsteps; the liveness thread only at ``worker_shutdown``,
    once the pool has drained, so that tasks finishing during a warm shutdown keep their
    worker alive in the cleaner's eyes.
    """

    label = "jobbers scheduler"
    # Start once the pool has forked its children: without this, the step order is left to
    # set iteration (it varies with PYTHONHASHSEED) and prefork children could be forked
    # while the scheduler thread holds locks (see _before_fork).
    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.scheduler: Scheduler | None = None
        self.liveness: liveness.Liveness | None = None

    def start(self, parent: Any) -> None:
        from jobbers_celery.jobbers import Jobbers

        jobbers = Jobbers.of(parent.app)
        hostname = getattr(parent, "hostname", None)
        self.liveness = liveness.Liveness(jobbers.store, jobbers.config, liveness.worker_id(),
                                          getattr(parent, "pool", None),
                                          jobbers.cleaner.recover_orphans)
        self.liveness.start()
        stop_liveness = self.liveness.stop

        def _on_shutdown(**_: Any) -> None:
            stop_liveness()

        signals.worker_shutdown.connect(_on_shutdown, weak=False,
                                        dispatch_uid=f"jobbers.liveness.{id(self)}")
        self.scheduler = jobbers.scheduler(hostname)
        self.scheduler.start()

    def stop(self, parent: Any) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()

    shutdown = stop
