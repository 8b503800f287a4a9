"""Jobbers: one app's lifecycle store, dead-letter queue and read API (``install(app)``).

``Jobbers`` is the one composition root of jobbers_celery: it builds the store, the
dead-letter dispatcher, the recorder, the publisher and the cleaner (and a worker's
scheduler), handing each what it uses and nothing more, so that the services below it never
import it back (``tests/unit/test_layers.py``). It also keeps the one registry of installed
instances (:meth:`Jobbers.of`, the public ``get_jobbers``) and serves the public reads and
actions.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from kombu.utils.imports import symbol_by_name

from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import (
    DeadLetter,
    SetAsideReport,
    TaskRecord,
    Transition,
    WorkerInfo,
)
from jobbers_celery.core.states import TaskState
from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
from jobbers_celery.deadletter.sink import DeadLetterSink, PayloadDeadLetterSink
from jobbers_celery.deadletter.spool import DeadLetterSpool, spool_directory
from jobbers_celery.lifecycle import payload, results
from jobbers_celery.lifecycle.cleaner import Cleaner, CleanerStatus, CleanReport
from jobbers_celery.lifecycle.publisher import Publisher
from jobbers_celery.lifecycle.recorder import Recorder
from jobbers_celery.lifecycle.scheduler import Scheduler
from jobbers_celery.resubmit import pacer
from jobbers_celery.resubmit.pace import ResubmitPace, ResubmitRunInfo
from jobbers_celery.resubmit.resubmit import ResubmitStore, Resubmitter
from jobbers_celery.store import CleanerStore, RedisStore, StepStore
from jobbers_celery.store.connect import redis_client
from jobbers_celery.store.errors import store_call as _store_call
from jobbers_celery.store.parts import DeadLetterStore, LayoutStore, RunningStore, RunStore
from jobbers_celery.telemetry.history import CountHistory, CountSample

if TYPE_CHECKING:
    from celery import Celery


class ServiceStore(StepStore, CleanerStore, ResubmitStore, Protocol):
    """What the services :meth:`Jobbers.compose` builds use of a store, all parts together."""


class JobbersStore(ServiceStore, RunStore, RunningStore, LayoutStore, DeadLetterStore,
                   Protocol):
    """Every part a :class:`Jobbers` uses: its services', its reads' and the dead-letter
    dispatcher's (the Redis store, or the in-memory one of :mod:`jobbers_celery.testing`)."""


__all__ = ["Jobbers", "JobbersStore", "PurgeReport"]

log = escaped_logger("jobbers")


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What ``purge`` did: terminal records removed, pending tasks cancelled, and matching
    tasks left alone because they are running (or between a retry and its republish)."""

    removed: int = 0
    cancelled: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Jobbers:
    """Reads are index-backed (never a keyspace scan); every change is one atomic step."""

    _count = itertools.count()

    def __init__(self, app: Celery, config: JobbersConfig, store: JobbersStore | None = None,
                 sink: DeadLetterSink | None = None) -> None:
        """``store`` and ``sink``: the ones to use instead of those ``config`` names (the
        in-memory fakes of :mod:`jobbers_celery.testing`); a store handed in gets no spool
        (an entry neither the sink nor that store takes waits in this process's memory)."""
        self._serial = next(Jobbers._count)
        self.app = app
        self.config = config
        spool = None
        if store is None:
            store = RedisStore(redis_client(config), config.key_prefix, config.retention,
                               config.store_shards)
            # entries that neither the sink nor Redis takes wait on local disk
            spool = DeadLetterSpool(spool_directory(config.dead_letter_spool,
                                                    config.key_prefix, config.redis_url))
        self.store: JobbersStore = store
        if sink is None:
            factory = symbol_by_name(config.dead_letter_sink)
            sink = factory(self)
        if not isinstance(sink, DeadLetterSink):
            raise TypeError(f"{config.dead_letter_sink} did not build a sink with write(entry)")
        self.sink: DeadLetterSink = sink
        # a sink that can hand entries back keeps the one copy of a dead task's payload
        self._payload_sink = (cast("PayloadDeadLetterSink", sink)
                              if callable(getattr(sink, "entry", None)) else None)
        # seals the arguments jobbers keeps, opens them where they are published again
        self.codec = PayloadCodec.of(config.payload_keys)
        self.compose(store, spool)

    def compose(self, store: JobbersStore, spool: DeadLetterSpool | None) -> None:
        """Build the dead-letter dispatcher and the services over ``store``: written once,
        for the Redis store and for the in-memory one of :mod:`jobbers_celery.testing`."""
        config = self.config
        self.dead_letters = DeadLetterDispatcher(
            self.sink, store,
            written=self._drop_record_payloads if self._payload_sink is not None else None,
            spool=spool)
        self.recorder = Recorder(store, self.dead_letters,
                                 payload_warn_bytes=config.payload_warn_bytes,
                                 publish_lease_s=config.publish_lease, codec=self.codec)
        self.publisher = Publisher(self.app, store, self.codec)
        self.cleaner = Cleaner(store, config, self.recorder, self.publisher)
        self.resubmitter = Resubmitter(
            self.app, store, self.recorder, self.publisher,
            self._payload_sink.entry if self._payload_sink is not None else None,
            unopenable=lambda e: payload.unopenable(e.args, e.kwargs, self.codec),
            fresh_headers=(payload.HEADER_ENQUEUED_AT,))
        self.count_sampler = CountHistory(store)

    def scheduler(self, worker_name: str | None = None) -> Scheduler:
        """A scheduler of this namespace (a worker runs one, see :mod:`runtime`)."""
        runs = None
        if self._payload_sink is not None:  # paced resubmits need entries read back
            runs = pacer.Pacer(self.store, self._payload_sink.entry,
                               lambda entries, reset, version: self.resubmit_dead_letters(
                                   entries, reset, version),
                               unopenable=self.resubmitter.unopenable,
                               claim_timeout_s=self.config.publish_lease,
                               exclusive_s=self.config.scheduler_interval * 0.8)
        return Scheduler(self.store, self.config, self.publisher, self.dead_letters,
                         self.cleaner, worker_name, history=self.count_sampler, pacer=runs)

    # ------------------------------------------------------------------ the registry
    # The one registry of installed instances: each app holds its own (``app._jobbers``,
    # one attribute read on the task's hot path), and this weak set lists them all (the
    # publish signal, which may not know the app, and the metric gauges read it).
    _installed: ClassVar[weakref.WeakSet[Jobbers]] = weakref.WeakSet()

    def register(self) -> None:
        """Make this the instance of its app (``install`` calls it), in place of the one
        registered before (``jobbers_celery.testing.in_memory``)."""
        before = Jobbers.find(self.app)
        if before is not None and before is not self:
            Jobbers._installed.discard(before)
        self.app._jobbers = self  # type: ignore[attr-defined]
        Jobbers._installed.add(self)

    @classmethod
    def find(cls, app: Any) -> Jobbers | None:
        """The instance installed on ``app``, ``None`` if there is none."""
        found: Jobbers | None = getattr(app, "_jobbers", None)
        return found

    @classmethod
    def of(cls, app: Celery) -> Jobbers:
        """The :class:`Jobbers` that ``install(app)`` returned (``get_jobbers``)."""
        jobbers: Jobbers | None = getattr(app, "_jobbers", None)
        if jobbers is None:
            raise ConfigurationError(f"jobbers is not installed on {app!r}: call install(app)")
        return jobbers

    @classmethod
    def installed(cls) -> list[Jobbers]:
        """Every installed instance of this process, oldest first."""
        return sorted(cls._installed, key=lambda j: j._serial)

    # ------------------------------------------------------------------ reads
    @_store_call
    def get(self, task_id: str) -> TaskRecord | None:
        return self.store.get(task_id)

    @_store_call
    def states_of(self, task_ids: Iterable[str]) -> dict[str, tuple[TaskState, int] | None]:
        """Each task's state and attempt now (``None``: no record), in one round trip (per
        node on a cluster): what a batch of reads such as a paced resubmit's settle needs,
        without one :meth:`get` per task."""
        ids = list(dict.fromkeys(task_ids))
        rows = self.store.fields(ids, ("state", "attempt")) if ids else []
        return {task_id: (TaskState(state), int(attempt) if attempt and attempt.isdigit() else 0)
                if state is not None else None
                for task_id, (state, attempt) in zip(ids, rows, strict=True)}

    @_store_call
    def history(self, task_id: str) -> list[Transition]:
        """Every transition of the task, oldest first."""
        return self.store.history(task_id)

    @_store_call
    def tasks(
        self,
        state: TaskState | str | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        worker: str | None = None,
    ) -> list[TaskRecord]:
        """Newest first. ``worker``: the hostname the task last ran on (``w1@host``)."""
        return self.store.tasks(TaskState(state) if state is not None else None, name, queue,
                                limit, worker)

    @_store_call
    def scheduled(self, limit: int = 100) -> list[TaskRecord]:
        """Tasks waiting for a delayed retry, soonest ``run_at`` first."""
        return self.store.scheduled(limit)

    @_store_call
    def workers(self) -> list[WorkerInfo]:
        """The worker incarnations seen alive within ``jobbers_worker_lost_after`` (what
        the cleaner also goes by), most recently seen first."""
        since = self.store.now_ms() - int(self.config.worker_lost_after * 1000)
        return [WorkerInfo.parse(wid, at, running)
                for wid, at, running in self.store.workers(since)]

    @_store_call
    def counts(self) -> dict[TaskState, int]:
        return self.store.counts()

    @_store_call
    def count_history(self, minutes: int = 60) -> list[CountSample]:
        """Tasks per state over the last ``minutes``, oldest first: one sample a minute,
        taken by the workers' schedulers (none while no worker runs; two hours are kept)."""
        return self.count_sampler.read(minutes)

    @_store_call
    def now(self) -> datetime:
        """The Redis clock (aware UTC): every time a record holds was read from it, so an
        elapsed time measured against this one does not depend on the caller's clock."""
        return datetime.fromtimestamp(self.store.now_ms() / 1000.0, tz=UTC)

    # ------------------------------------------------------------------ actions
    @_store_call
    def resubmit(self, task_ids: Iterable[str], reset_retry_count: bool = True,
                 version: ResubmitVersion | str = ResubmitVersion.ENTRY) -> list[str]:
        """Send failed, stalled, dropped or cancelled tasks back to the broker (same id).

        ``reset_retry_count`` also resets the count of automatic stall recoveries.
        ``version``: ``"entry"`` (default) publishes each task as the version it has;
        ``"current"`` as the version its name has in this process's app (see
        :meth:`current_versions`, which raises ``ValueError``, before anything changes, if
        a task is not registered here).

        Returns the ids actually resubmitted; others (unknown, running, completed, or
        already resubmitted by a concurrent caller) are skipped. A task whose arguments were
        never recorded as JSON is not published: it goes back to ``dropped``, its history
        saying why.

        A dead-lettered task whose record no longer holds its payload (the dead-letter sink
        keeps it, see :class:`~jobbers_celery.deadletter.sink.PayloadDeadLetterSink`) is published
        with the payload of its dead-letter entry.
        """
        return self.resubmitter.resubmit(task_ids, reset_retry_count, version)

    def current_versions(self, names: Iterable[str]) -> dict[str, int]:
        """The version each task name has in this process's app (what ``"current"`` means
        to a resubmit). Raises ``ValueError`` naming every one that is not registered here
        as a :class:`~jobbers_celery.JobbersTask`: its current version is unknown."""
        return self.resubmitter.current_versions(names)

    def _drop_record_payloads(self, entries: Sequence[DeadLetter]) -> None:
        """The sink took ``entries``: their records forget their copies of the payloads."""
        self.store.drop_payloads([(e.task_id, e.attempt) for e in entries])

    def readable(self, entry: DeadLetter) -> DeadLetter:
        """``entry`` with its arguments as a reader may see them (redact them after):
        opened where this process holds the payload key that sealed them, else
        ``[ENCRYPTED]`` and ``{}`` (see ``jobbers_payload_keys``)."""
        args, kwargs = payload.readable_arguments(entry.args, entry.kwargs, self.codec)
        if args is entry.args and kwargs is entry.kwargs:
            return entry
        return dataclasses.replace(entry, args=args, kwargs=kwargs)

    @_store_call
    def resubmit_dead_letters(
        self, entries: Iterable[DeadLetter], reset_retry_count: bool = True,
        version: ResubmitVersion | str = ResubmitVersion.ENTRY,
    ) -> list[str]:
        """Resubmit tasks from their dead-letter entries (same id), as a DLQ front end does.

        The new run carries the entry's args, kwargs, publish options, version and
        checkpoint, even when the task's Redis record has expired since: a record that is
        still there goes ``failed``/``stalled``/``dropped``/``cancelled`` -> ``submitted``;
        a missing one is created as ``submitted``. A task whose record is in any other state
        (resubmitted by someone else, running, completed) is skipped, and so is an entry
        that cannot be published (:attr:`DeadLetter.unpublishable`: its arguments were never
        recorded as JSON) or whose arguments are sealed with a payload key this process does
        not hold (logged; nothing changes: a process holding the key can resubmit it).
        Returns the ids published; at most one caller publishes a given
        failure, however many race.

        ``version="current"`` publishes each task as the version its name has in this
        process's app instead of the entry's (:meth:`current_versions` raises ``ValueError``
        before anything changes if a name is not registered here). The default keeps the
        entry's: a worker running another version then drops it again, rather than call
        changed code with arguments made for the old one.
        """
        return self.resubmitter.resubmit_dead_letters(entries, reset_retry_count, version)

    # ------------------------------------------------------------------ paced resubmits
    @_store_call
    def start_resubmit_run(
        self, entries: Iterable[DeadLetter], rate: float, halt_after: int | None = None,
        of_last: int | None = None, *, reset_retry_count: bool = True,
        version: ResubmitVersion | str = ResubmitVersion.ENTRY,
        selection: dict[str, Any] | None = None, source: str = "code", username: str = "",
    ) -> ResubmitRunInfo:
        """Start a paced resubmit of ``entries`` (dead letters of a sink that can hand
        entries back, such as the Redis sink): the workers' scheduler passes publish them
        through :meth:`resubmit_dead_letters`, ``rate`` per second, and halt the run when
        more than ``halt_after`` of the last ``of_last`` settled tasks failed again.

        Each entry is published at most once per run, whatever races. Raises ``ValueError``
        (:class:`~jobbers_celery.resubmit.pace.PaceError`, naming the field) for a pace out of
        bounds (``0.1 <= rate <= 500``, ``0 <= halt_after <= of_last <= 1000``, at most
        10,000 entries: ``ResubmitPace``), and, with
        ``version="current"``, for a task not registered here, before anything changes.
        ``selection`` describes what was selected (``task_ids``, or ``filters`` and
        ``limit``), for the run's readers. Follow it with :meth:`resubmit_run`."""
        pace = ResubmitPace(rate, halt_after, of_last)
        if self._payload_sink is None:
            raise ConfigurationError(
                f"paced resubmits need a dead-letter sink that can hand entries back "
                f"(entry()); {type(self.sink).__name__} cannot")
        batch = list(entries)
        choice = ResubmitVersion(version)
        if choice is ResubmitVersion.CURRENT:
            self.current_versions(e.name for e in batch if not e.unpublishable)
        run_id = pacer.start(self.store, batch, pace, reset_retry_count=reset_retry_count,
                             version=choice, selection=selection, source=source,
                             username=username)
        info = pacer.read(self.store, run_id)
        assert info is not None
        return info

    @_store_call
    def resubmit_run(self, run_id: int) -> ResubmitRunInfo | None:
        """A paced resubmit's status and counters now; ``None`` if there is no such run
        (finished runs are kept for ``jobbers_retention``)."""
        return pacer.read(self.store, run_id)

    @_store_call
    def resubmit_runs(self, limit: int = 20) -> list[ResubmitRunInfo]:
        """Paced resubmits, newest first."""
        found = (pacer.read(self.store, run_id) for run_id in self.store.runs(limit))
        return [info for info in found if info is not None]

    def pause_resubmit_run(self, run_id: int, by: str = "code") -> ResubmitRunInfo:
        """Publish nothing more until resumed; what was published is still followed.
        Raises ``LookupError`` (no such run) or :class:`ResubmitRunConflict`."""
        return self._control_run(run_id, "pause", by)

    def resume_resubmit_run(self, run_id: int, by: str = "code") -> ResubmitRunInfo:
        """Publish again, at the run's pace counted from now."""
        return self._control_run(run_id, "resume", by)

    def cancel_resubmit_run(self, run_id: int, by: str = "code") -> ResubmitRunInfo:
        """Publish nothing more, for good: the unpublished entries stay dead."""
        return self._control_run(run_id, "cancel", by)

    @_store_call
    def _control_run(self, run_id: int, action: str, by: str) -> ResubmitRunInfo:
        pacer.control(self.store, run_id, action, by)
        info = pacer.read(self.store, run_id)
        assert info is not None
        return info

    @_store_call
    def cancel(self, task_id: str, terminate: bool = False) -> bool:
        """Cancel a task durably (it never runs, whichever worker receives it, whenever).

        A submitted or scheduled task is ``cancelled`` at once. A started one raises
        :class:`TaskCancelled` at its next ``heartbeat()`` and ends ``cancelled``; with
        ``terminate=True`` its worker also interrupts it (prefork pool) once
        ``jobbers_cancel_grace`` seconds have passed without it stopping. Returns whether
        the task was cancelled or its cancellation requested; ``False`` if it is unknown or
        already finished.

        Celery is told as for its own revoke: a task cancelled at once is REVOKED in the
        result backend now; one that was running is REVOKED (backend and a ``task-revoked``
        event) when its worker ends it, as is a cancelled message a worker receives.
        """
        grace = int(self.config.cancel_grace * 1000) if terminate else None
        done = self.store.cancel(task_id, "cancelled by request", terminate_ms=grace)
        if done.outcome != "no":
            log.info("task %s: cancellation %s (it was %s)", task_id, done.outcome,
                     done.previous)
        if done.outcome == "cancelled":
            results.mark_revoked(self.app.backend, task_id, "cancelled by request")
        return done.outcome != "no"

    @_store_call
    def clean(self) -> CleanReport:
        """Run one cleaner pass now (what the ``jobbers.clean`` beat task does)."""
        return self.cleaner.run(by="clean()")

    @_store_call
    def set_aside(self, limit: int = 100) -> SetAsideReport:
        """The newest ``limit`` dead letters set aside (the sink refused them for a reason of
        their own, or they could not be read back), how many the list keeps and how many
        were ever set aside: see :mod:`jobbers_celery.deadletter.aside`."""
        return self.dead_letters.aside.report(limit)

    @_store_call
    def cleaner_status(self) -> CleanerStatus:
        return self.cleaner.status()

    @_store_call
    def purge(
        self,
        name: str | None = None,
        queue: str | None = None,
        submitted_before: datetime | None = None,
    ) -> PurgeReport:
        """Remove matching terminal records; cancel matching submitted or scheduled tasks.

        Criteria combine (all must match). At least one is required: purging everything
        by accident is not a thing this method does. Running tasks are left alone (see
        :meth:`cancel`) and reported as skipped.
        """
        if name is None and queue is None and submitted_before is None:
            raise ValueError("purge() needs at least one of name, queue, submitted_before")
        if submitted_before is not None and submitted_before.tzinfo is None:
            raise ValueError("submitted_before must be timezone-aware (UTC)")
        cutoff = (int(submitted_before.timestamp() * 1000) if submitted_before is not None
                  else None)
        removed, cancelled, skipped = self.store.purge(name, queue, cutoff)
        return PurgeReport(removed=removed, cancelled=cancelled, skipped=skipped)
