"""The scheduler: re-publishes delayed retries when their ``run_at`` arrives.

A worker runs it in a thread of its main process (see :mod:`jobbers_celery.worker.runtime`). A due
task is claimed atomically (``scheduled -> submitted`` plus a publish lease) so several
workers never both publish it; a claim whose publisher died is published again once its
lease expires, and the start step drops the duplicate should both messages arrive. A due
task of a ``concurrency_key`` task (fair shares) is published by its own submit step
instead, which parks it when its key has no room (:meth:`Scheduler._fair_due`). Each
pass also retries parked dead letters, prunes expired terminal records, and runs a catch-up
cleaner pass when celery beat has not run one for three cleaner intervals, and drives the
paced resubmits (:mod:`jobbers_celery.resubmit.pacer`, a bounded step per run and pass). This module
decides what one pass does; the thread that repeats it lives in the runtime.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from jobbers_celery.core.codec import CannotOpen
from jobbers_celery.core.fairshare import ConcurrencyKeyError, FairKey
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle.publisher import UnpublishablePayload
from jobbers_celery.telemetry import metrics

if TYPE_CHECKING:
    from jobbers_celery.core.config import JobbersConfig
    from jobbers_celery.core.options import TaskOptions
    from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
    from jobbers_celery.lifecycle.cleaner import Cleaner
    from jobbers_celery.lifecycle.periodic import PeriodicWatch
    from jobbers_celery.lifecycle.publisher import Publisher
    from jobbers_celery.resubmit.pacer import Pacer
    from jobbers_celery.store import Claimed, SchedulerStore, SchedulingStore, StepStore
    from jobbers_celery.telemetry.history import CountHistory
    from jobbers_celery.telemetry.series import Series

    class FairDueStore(SchedulerStore, StepStore, Protocol):
        """What the scheduler's fair-share decision on a due task uses (the store of a
        worker, Redis or the in-memory kit, has it all)."""

        def fields(self, ids: Sequence[str], names: Sequence[str]
                   ) -> list[list[str | None]]: ...

__all__ = ["Scheduler", "call_fair_key", "release_and_publish"]

S = TaskState

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
#: The lease of the scheduler that decides the keyed due tasks (fair shares) lasts this
#: many scheduler intervals (at least 2 s): renewed by each of its passes, taken over by
#: another scheduler once it lapses (its worker stopped or cannot reach the store).
_FAIR_DUE_LEASES = 5


def call_fair_key(task: Any, args: Any, kwargs: Any) -> FairKey | None:
    """The key a call of ``task`` with ``args``/``kwargs`` counts under (``None``: not a
    ``concurrency_key`` task, or arguments that give no key, which its start fails)."""
    opts: TaskOptions | None = getattr(task, "jobbers_options", None)
    if opts is None or opts.concurrency_key is None or not opts.max_concurrent:
        return None
    try:
        digest = opts.concurrency_key.digest(getattr(task, "run", None), args or (),
                                             kwargs or {})
    except ConcurrencyKeyError:
        return None
    return FairKey(digest, opts.max_concurrent)


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
        self._token = f"{worker_name or ''}:{uuid.uuid4().hex}"  # its fair-due lease's
        #: run the fair shares' release pass (set when a registered task has a
        #: ``concurrency_key``: other workers' passes cost no call for it)
        self.fair_shares = False

    def run_once(self) -> tuple[int, float | None]:
        """Claim and publish what is due. Returns (published, seconds until the next run_at)."""
        store = self.store
        ids, next_ms = store.due(self.batch)
        released = store.fair_release().ids if self.fair_shares else {}
        published = 0
        if self.fair_shares and ids:  # due tasks of a key with no room: parked, not sent
            ids, published = self._fair_due(ids, released)
        if released:  # parked tasks whose key has room (fair shares): published as due
            ids = list(dict.fromkeys([*ids, *released]))
        if self._sealed_away:
            ids = self._not_sealed_away(ids)
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
            published += len(done)
        wait = None
        if next_ms is not None:
            wait = max(0.0, (next_ms - store.now_ms()) / 1000.0)
        return published, wait

    def _fair_due(self, ids: list[str], released: Collection[str]) -> tuple[list[str], int]:
        """The due tasks of a ``concurrency_key`` task (fair shares): a delayed first
        publish (``countdown``/``eta``) or a delayed retry whose ``run_at`` came, a task
        deferred at its start (``max_concurrent``, a rate limit), a parked task whose
        backstop came. Each is published by its own submit step, which parks it when its
        key has no room (its publish's fair-share decision, ``scheduled -> submitted ->
        scheduled``: no message), else counts it on its way and takes the publish lease,
        as the claim does. Returns the other ids (the claim's) and the tasks published.

        One scheduler at a time decides them (a lease, renewed each pass): the step is
        not the claim, which takes a task only if its ``run_at`` came, so two schedulers
        that both read a task as due would both apply it (the second after the first
        parked it). The others leave them out of their claim. A task the scheduler's
        worker has not registered, whose arguments it cannot open or that give no key
        goes the claim's way (parked at its start if its key is full). Costs one read of
        the due ids' states and names, one of the keyed ones' payloads, then one step per
        keyed task (instead of its share of the claim's call)."""
        store = cast("FairDueStore", self.store)
        keyed = self._keyed_due(store, [i for i in ids if i not in released])
        if not keyed:
            return ids, 0
        ttl_ms = int(max(_FAIR_DUE_LEASES * self.config.scheduler_interval, 2.0) * 1000)
        if not store.hold_lease(store.keys.lock("fair-due"), self._token, ttl_ms):
            return [i for i in ids if i not in keyed], 0  # the lease holder's
        lease_ms = int(self.config.publish_lease * 1000)
        done: list[str] = []
        settled: set[str] = set()
        for task_id, (name, key, run_at_ms) in keyed.items():
            try:
                res = store.submit(task_id, sources=(S.SCHEDULED,), reason="run_at reached",
                                   name=name, lease_ms=lease_ms, fair=key,
                                   ret=("msg", "retries", "queue"))
            except Exception:  # the store away: the rest waits for the next pass
                log.exception("could not publish due task %s; it will be tried again",
                              task_id)
                settled.update(keyed)
                break
            settled.add(task_id)  # published, parked, or no longer scheduled
            if not res.applied:
                continue
            if res.state is not S.SUBMITTED:  # parked: nothing to publish, no lease held
                store.confirm_published([task_id])
                continue
            metrics.selected(name, res.values.get("queue", ""), metrics.ROLE_SCHEDULER,
                             res.now_ms - run_at_ms)
            try:
                self.publisher.republish(task_id, name,
                                         self.publisher.payload_of(res.values.get("msg")),
                                         int(res.values.get("retries") or 0), res.now_ms)
                done.append(task_id)
            except Exception:
                log.exception("could not publish due task %s; it will be published after "
                              "its lease", task_id)
        store.confirm_published(done)
        return [i for i in ids if i not in settled], len(done)

    def _keyed_due(self, store: FairDueStore, ids: list[str]
                   ) -> dict[str, tuple[str, FairKey, int]]:
        """Of ``ids``, the scheduled tasks of a ``concurrency_key`` task this worker has
        registered whose arguments give their key: id -> (name, key, run_at)."""
        if not ids:
            return {}
        tasks = self.publisher.app.tasks
        found: dict[str, tuple[Any, str, int]] = {}
        for task_id, (state, run_at, name) in zip(
                ids, store.fields(ids, ("state", "run_at", "name")), strict=True):
            if state != S.SCHEDULED.value or not run_at or not name:
                continue
            task = tasks.get(name)
            if getattr(getattr(task, "jobbers_options", None), "concurrency_key",
                       None) is not None:
                found[task_id] = (task, name, int(float(run_at)))
        now_ms = store.now_ms() if found else 0
        found = {i: row for i, row in found.items() if row[2] <= now_ms}  # due still
        if not found:
            return {}
        keyed: dict[str, tuple[str, FairKey, int]] = {}
        msgs = store.fields(list(found), ("msg",))
        for (task_id, (task, name, due_at)), (msg,) in zip(found.items(), msgs, strict=True):
            try:
                data = self.publisher.payload_of(msg)
                args, kwargs = pl.open_arguments(data.get("args"), data.get("kwargs"),
                                                 self.publisher.codec)
            except (CannotOpen, UnpublishablePayload, ValueError):
                continue  # the claim's way: sealed away, or not publishable
            key = call_fair_key(task, args, kwargs)
            if key is not None:
                keyed[task_id] = (name, key, due_at)
        return keyed

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
