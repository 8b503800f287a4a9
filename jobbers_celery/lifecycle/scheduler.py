"""The scheduler: re-publishes delayed retries when their ``run_at`` arrives.

A worker runs it in a thread of its main process (see :mod:`jobbers_celery.worker.runtime`). A due
task is claimed atomically (``scheduled -> submitted`` plus a publish lease) so several
workers never both publish it; a claim whose publisher died is published again once its
lease expires, and the start step drops the duplicate should both messages arrive. Each
pass also retries parked dead letters, prunes expired terminal records, and runs a catch-up
cleaner pass when celery beat has not run one for three cleaner intervals, and drives the
paced resubmits (:mod:`jobbers_celery.resubmit.pacer`, a bounded step per run and pass). This module
decides what one pass does; the thread that repeats it lives in the runtime.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jobbers_celery.core.codec import CannotOpen
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.telemetry import metrics

if TYPE_CHECKING:
    from jobbers_celery.core.config import JobbersConfig
    from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
    from jobbers_celery.lifecycle.cleaner import Cleaner
    from jobbers_celery.lifecycle.periodic import PeriodicWatch
    from jobbers_celery.lifecycle.publisher import Publisher
    from jobbers_celery.resubmit.pacer import Pacer
    from jobbers_celery.store import Claimed, SchedulerStore, SchedulingStore
    from jobbers_celery.telemetry.history import CountHistory
    from jobbers_celery.telemetry.series import Series

__all__ = ["Scheduler", "release_and_publish"]

log = escaped_logger("jobbers.scheduler")

_BATCH = 500
HOUSEKEEPING_EVERY_S = 10.0
#: One housekeeping pass prunes for at most this long, then yields to due retries.
_HOUSEKEEPING_BUDGET_S = 1.0
#: A due task whose arguments this worker cannot open (sealed with a payload key it does not
#: hold) is left alone this many publish leases, so that a worker holding the key claims it
#: when the lease expires (this one would win every claim, waking at the lease's end).
_SEALED_AWAY_LEASES = 5
_SEALED_AWAY_MAX = 10_000


def release_and_publish(store: SchedulingStore, publisher: Publisher, keys: Sequence[tuple[str, str]],
                        lease_ms: int, worker: str | None) -> int:
    """Release the parked tasks of ``keys`` (``(name, digest)``) that have room now and
    publish them (fair shares: the end of a keyed task, so that its key's next task need
    not wait for a scheduler pass). A claim this process fails to publish is published by
    a scheduler when its lease expires. Returns the tasks published."""
    released = store.fair_release(keys=keys)
    if not released.ids:
        return 0
    claimed = store.claim(list(released.ids), lease_ms, worker, released.ids)
    _unclaimed(store, released.ids, claimed)
    done = []
    for item in claimed:
        try:
            publisher.republish(item.task_id, item.name, publisher.payload_of(item.msg),
                                item.retries, released.now_ms)
            done.append(item.task_id)
        except Exception:
            log.exception("could not publish released task %s; it will be published after "
                          "its lease", item.task_id)
    store.confirm_published(done)
    return len(done)


def _unclaimed(store: SchedulingStore, released: dict[str, tuple[str, str]],
               claimed: Sequence[Claimed]) -> None:
    """Released tasks the claim did not take (cancelled, purged, published already) stop
    holding their key's room back at once."""
    got = {item.task_id for item in claimed}
    store.fair_unreleased([(i, *released[i]) for i in released if i not in got])


class Scheduler:
    """Publishes the due retries of one jobbers namespace, and runs its housekeeping.

    ``dead_letters`` (whose parked entries housekeeping retries), ``cleaner`` (whose
    catch-up pass it runs when beat runs none) and ``history`` (the per-state counts that
    housekeeping samples once a minute) may be left out by a caller that only publishes.
    """

    def __init__(self, store: SchedulerStore, config: JobbersConfig, publisher: Publisher,
                 dead_letters: DeadLetterDispatcher | None = None,
                 cleaner: Cleaner | None = None, worker_name: str | None = None, *,
                 batch: int = _BATCH, history: CountHistory | None = None,
                 pacer: Pacer | None = None, series: Series | None = None,
                 periodic: PeriodicWatch | None = None) -> None:
        self.store = store
        self.config = config
        self.publisher = publisher
        self.dead_letters = dead_letters
        self.cleaner = cleaner
        self.history = history
        self.series = series
        self.pacer = pacer
        self.periodic = periodic
        self.batch = batch
        self.worker_name = worker_name
        self._last_housekeeping = 0.0
        self._last_catch_up_check = time.monotonic()
        self._sealed_away: dict[str, float] = {}  # task id -> monotonic time to try again
        #: run the fair shares' release pass (set when a registered task has a
        #: ``concurrency_key``: other workers' passes cost no call for it)
        self.fair_shares = False

    def run_once(self) -> tuple[int, float | None]:
        """Claim and publish what is due. Returns (published, seconds until the next run_at)."""
        store = self.store
        ids, next_ms = store.due(self.batch)
        released = store.fair_release().ids if self.fair_shares else {}
        if released:  # parked tasks whose key has room (fair shares): published as due
            ids = list(dict.fromkeys([*ids, *released]))
        if self._sealed_away:
            ids = self._not_sealed_away(ids)
        published = 0
        if ids:
            lease_ms = int(self.config.publish_lease * 1000)
            claimed = store.claim(ids, lease_ms, self.worker_name, released)
            if released:
                _unclaimed(store, released, claimed)
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
                except CannotOpen as exc:  # never published with the sealed form as arguments
                    if len(self._sealed_away) < _SEALED_AWAY_MAX:
                        self._sealed_away[item.task_id] = (
                            time.monotonic() + _SEALED_AWAY_LEASES * self.config.publish_lease)
                    log.warning("due task %s not published by this worker: %s; left for a "
                                "worker that holds that key (when its lease expires)",
                                item.task_id, exc)
                except Exception:
                    log.exception("could not publish due task %s; it will be tried again "
                                  "after its lease", item.task_id)
            store.confirm_published(done)
            published = len(done)
        wait = None
        if next_ms is not None:
            wait = max(0.0, (next_ms - store.now_ms()) / 1000.0)
        return published, wait

    def _not_sealed_away(self, ids: list[str]) -> list[str]:
        now = time.monotonic()
        for task_id, until in list(self._sealed_away.items()):
            if until <= now:
                del self._sealed_away[task_id]
        return [i for i in ids if i not in self._sealed_away]

    def _publish(self, item: Claimed, now_ms: int) -> None:
        publisher = self.publisher
        publisher.republish(item.task_id, item.name, publisher.payload_of(item.msg),
                            item.retries, now_ms)

    def housekeeping(self) -> int:
        """Retry parked dead letters; sample the counts (once a minute across workers);
        prune expired records. Returns records pruned.

        One worker at a time (a short lock; pruning is compare-and-set, so the lock only saves
        duplicate work). Pruning drains in batches until nothing is left or the time budget is
        spent, so index entries never pile up faster than they are removed.
        """
        if self.dead_letters is not None:
            self.dead_letters.retry_pending()
        if self.history is not None:
            self.history.sample()
        if self.series is not None:
            self.series.configure()  # the history settings the steps read
        store = self.store
        if not store.try_lock("housekeeping", int(HOUSEKEEPING_EVERY_S * 1000)):
            return 0
        pruned, started = 0, time.monotonic()
        while time.monotonic() - started < _HOUSEKEEPING_BUDGET_S:
            n = store.prune()
            pruned += n
            if n == 0:
                break
        return pruned

    def tick(self) -> float:
        """One pass of a worker's scheduler thread: publish what is due, housekeeping every
        ``HOUSEKEEPING_EVERY_S``, a catch-up cleaner pass when beat ran none for a while,
        a step of each paced resubmit. Returns the seconds to wait before the next pass."""
        interval = self.config.scheduler_interval
        wait = interval
        _, next_due = self.run_once()
        if next_due is not None:
            wait = min(interval, next_due)
        if self.pacer is not None:
            self.pacer.pass_once()
        if time.monotonic() - self._last_housekeeping > HOUSEKEEPING_EVERY_S:
            self._last_housekeeping = time.monotonic()
            self.housekeeping()
        every = self.config.cleaner_interval
        if self.cleaner is not None and time.monotonic() - self._last_catch_up_check > every:
            self._last_catch_up_check = time.monotonic()
            self.cleaner.catch_up(by=f"catch-up in {self.worker_name}")
        if self.periodic is not None:  # missed beat slots: here, since beat may be down
            self.periodic.maybe_judge()
        return wait
