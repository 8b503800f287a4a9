"""Jobbers: one app's lifecycle store, dead-letter queue and read API (``install(app)``).

``Jobbers`` is the one composition root of jobbers_celery: what it builds (the store, the
dead-letter dispatcher, the recorder, the publisher and the cleaner, each handed what it
uses and nothing more) is :class:`~jobbers_celery.composition.Composition`'s, which it
extends with a worker's scheduler. It also keeps the one registry of installed instances
(:meth:`Jobbers.of`, the public ``get_jobbers``) and serves the public reads and actions.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from jobbers_celery.composition import Composition, JobbersStore
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.fairshare import FairHeld
from jobbers_celery.core.intake import identity_over_limits
from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.core.pauses import Pause, PauseError, PauseKind
from jobbers_celery.core.periodic import PeriodicSchedule
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.ratelimit import RateLimitInfo
from jobbers_celery.core.records import (
    DeadLetter,
    SetAsideReport,
    TaskRecord,
    Transition,
    WorkerInfo,
)
from jobbers_celery.core.search import SearchResult
from jobbers_celery.core.states import TERMINAL, TaskState
from jobbers_celery.core.unique import Unique, UniqueInfo, key_digest, validate_unique
from jobbers_celery.core.workflow import Workflow, WorkflowRead, WorkflowState, derive
from jobbers_celery.lifecycle import chords, fleet, payload, ratelimits, results
from jobbers_celery.lifecycle.cleaner import CleanerStatus, CleanReport
from jobbers_celery.lifecycle.pausing import PauseOutcome
from jobbers_celery.lifecycle.scheduler import Scheduler
from jobbers_celery.resubmit import pacer
from jobbers_celery.resubmit.pace import ResubmitPace, ResubmitRunInfo
from jobbers_celery.store.errors import store_call as _store_call
from jobbers_celery.telemetry.history import CountSample
from jobbers_celery.telemetry.series import SeriesRead

if TYPE_CHECKING:
    from celery import Celery


__all__ = ["Jobbers", "JobbersStore", "PurgeReport"]

log = escaped_logger("jobbers")

#: Members a workflow action (cancel, resubmit) reads at most.
WORKFLOW_ACTION_LIMIT = 100_000
#: States of the members ``resubmit_workflow`` resubmits.
_FAILED_FOR_GOOD = frozenset({TaskState.FAILED, TaskState.STALLED, TaskState.DROPPED})


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What ``purge`` did: terminal records removed, pending tasks cancelled, and matching
    tasks left alone because they are running (or between a retry and its republish)."""

    removed: int = 0
    cancelled: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Jobbers(Composition):
    """Reads are index-backed (never a keyspace scan); every change is one atomic step."""

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
                         self.cleaner, worker_name, history=self.count_sampler, pacer=runs,
                         series=self.series_reader, periodic=self.periodic)

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
    def unique_of(self, task_id: str) -> UniqueInfo | None:
        """A unique task's lock (``None``: not a unique task, or no record): its key's
        digest (never the values), until when it holds, and the copy holding it now."""
        return self.store.unique_of(task_id)

    @_store_call
    def unique_holder(self, task_name: str, args: Sequence[Any] = (),
                      kwargs: Mapping[str, Any] | None = None,
                      unique: Unique | None = None) -> str | None:
        """The id of the copy of ``task_name`` holding the lock a publish with ``args`` and
        ``kwargs`` would ask for (the task's ``unique``, or ``unique``), ``None`` if free.
        Raises ``ValueError`` for a task that is not unique here."""
        task = self.app.tasks.get(task_name)
        spec = validate_unique(unique) if unique is not None else getattr(getattr(
            task, "jobbers_options", None), "unique", None)
        if spec is None:
            raise ValueError(f"{task_name} is not a unique task here (pass unique=)")
        return self.store.unique_holder(key_digest(task_name, spec, args, kwargs,
                                                   getattr(task, "run", None)))

    # ------------------------------------------------------------------ workers, queues
    @_store_call
    def pause(self, *, name: str | None = None, queue: str | None = None,
              by: str = "code") -> PauseOutcome:
        """Pause a task name (its messages are held, visible as ``scheduled``, paused) or
        a queue (no worker consumes it) on every worker, those started later too. Returns
        the workers that applied it at once (see :mod:`~.lifecycle.pausing`)."""
        kind, target = _pause_target(name, queue)
        return self.pausing.pause(kind, target, by)

    @_store_call
    def resume(self, *, name: str | None = None, queue: str | None = None,
               by: str = "code") -> PauseOutcome:
        """End a pause; a task name's held tasks are published again, each once."""
        kind, target = _pause_target(name, queue)
        return self.pausing.resume(kind, target, by)

    @_store_call
    def pauses(self) -> list[Pause]:
        """Every pause in force, oldest first."""
        return self.pausing.pauses()

    @_store_call
    def held_count(self, name: str) -> int:
        """Tasks of ``name`` held by its pause."""
        return self.store.held_count(name)

    @_store_call
    def rate_limits(self) -> list[RateLimitInfo]:
        """Every rate limit keyed by arguments: declared here (``rate_limit_by``) or set by
        an operator, and how many tasks of each name wait on it now."""
        return ratelimits.read(self.app, self.store)

    @_store_call
    def set_rate_limit(self, name: str, rate: str | None) -> str | None:
        """Override ``name``'s rate from its next start on, in every worker (``"10/s"``, or
        ``"off"``: unlimited); ``None`` clears it (the declared rate again). Raises
        ``ValueError`` for a bad rate."""
        return ratelimits.set_override(self.store, name, rate)

    def check_rate_limit_override(self, name: str, rate: str | None) -> None:
        """Raise ``ValueError`` when setting ``rate`` on ``name`` would never apply: no task
        of this app declares ``rate_limit_by`` under it (clearing is always allowed). The
        admin and the REST API check before :meth:`set_rate_limit`."""
        ratelimits.refuse_undeclared(self.app, name, rate)

    @_store_call
    def fair_held(self, limit: int = 100) -> list[FairHeld]:
        """What fair shares hold back now (``concurrency_key``), most parked first: per task
        name and key (its digest, never the value) the tasks parked, those on their way to
        start, those running, and the cap per key."""
        return self.store.fair_held(limit)

    def worker_views(self, timeout: float = fleet.INSPECT_TIMEOUT_S) -> list[fleet.WorkerView]:
        """Each worker that answers Celery's ``inspect`` or that jobbers sees alive: pool,
        queues, running tasks with their heartbeat and progress."""
        return fleet.read_workers(self.app, self.workers(), self.get, timeout)

    @_store_call
    def queues(self, workers: list[fleet.WorkerView] | None = None) -> list[fleet.QueueInfo]:
        """Each queue's depth and the age of its oldest message; ``workers`` (from
        :meth:`worker_views`) adds the queues they consume and who consumes each."""
        paused = {p.target for p in self.pauses() if p.kind is PauseKind.QUEUE}
        consumers: dict[str, list[str]] = {}
        for w in workers or ():
            for q in w.queues:
                consumers.setdefault(q, []).append(w.hostname)
        names = fleet.queue_names(self.app, consumers, paused)
        infos = fleet.read_queues(self.app, names, self.store.now_ms(), self.get,
                                  self.store.oldest_submitted)
        return [dataclasses.replace(q, paused=q.name in paused,
                                    consumers=consumers.get(q.name, [])) for q in infos]

    @_store_call
    def counts(self) -> dict[TaskState, int]:
        return self.store.counts()

    @_store_call
    def periodic_tasks(self, runs: int = 10) -> list[PeriodicSchedule]:
        """Every beat schedule watched, by name, with its counts of missed, late and
        overlapping runs and its newest ``runs`` runs (``docs/howto/periodic.md``)."""
        return self.periodic.schedules(runs)

    @_store_call
    def series(self, *, name: str | None = None, queue: str | None = None,
               since: datetime | None = None, until: datetime | None = None,
               step: int | None = None) -> SeriesRead:
        """Throughput, failures, mean runtime and mean queue latency of task ``name``, or of
        ``queue``, or of every task (neither), per ``step`` minutes (1, 5, 15 or 60;
        default by span) over ``[since, until)`` (default: the last hour), kept
        ``jobbers_history_days``. Raises ``SeriesRangeError`` (a ``ValueError``) for a
        range it refuses. See ``docs/howto/history.md``."""
        return self.series_reader.read(name=name, queue=queue, since=since, until=until,
                                       step=step)

    @_store_call
    def series_names(self, days: float = 1.0) -> tuple[list[str], list[str]]:
        """The task names and the queues the history holds for the last ``days``."""
        return self.series_reader.names(days)

    @_store_call
    def search(self, argument: str, value: str, *, name: str | None = None,
               limit: int = 100) -> SearchResult:
        """Tasks whose argument at path ``argument`` (``order_id``, ``0``, ``order.id``)
        holds ``value``, newest first, at most ``limit`` (1 to 1,000), of task ``name``
        (``None``: any): through the index when ``jobbers_indexed_arguments`` indexes the
        path, else among the newest ``jobbers_search_scan_limit`` records that still hold
        their arguments (:attr:`SearchResult.how` says which, and how much was read).
        Raises ``ValueError`` for a malformed path or value, or a path reading a redacted
        key. See ``docs/howto/search.md``."""
        return self.arguments.find(argument, value, name, limit)

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

    @_store_call
    def release_chord_parts(self, entries: Iterable[DeadLetter]) -> list[str]:
        """Fail the chords that discarded dead letters held (call it after discarding
        ``entries``; every DLQ front end's discard does): a chord header member whose failure
        went to the dead-letter queue holds its chord part, so the chord's callback waits for
        a resubmit (:mod:`jobbers_celery.lifecycle.chords`). Discarded, its part is counted
        failed in Celery's result backend, as Celery counts it: the callback fails with
        ``ChordError`` once every other part returned. Only for members still dead at that
        entry's attempt (one resubmitted since counts its own part). Idempotent; returns the
        task ids released."""
        batch = list(entries)
        if not batch:
            return []
        now = self.states_of(e.task_id for e in batch)
        return chords.release(self.app, chords.releasable(batch, now))

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

    def continue_resubmit_run(self, run_id: int, by: str = "code") -> ResubmitRunInfo:
        """A halted run goes on (its cause fixed): at its pace counted from now, its stop
        rule's window emptied (the failures that halted it do not count again)."""
        return self._control_run(run_id, "continue", by)

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

    # ------------------------------------------------------------------ workflows
    @_store_call
    def workflow(self, task_id: str, limit: int = 1000) -> Workflow | None:
        """The canvas ``task_id`` belongs to, as one unit: ``task_id`` is any recorded
        member's id, the workflow's root (see :mod:`jobbers_celery.core.workflow` for which
        id that is for each kind of canvas), a group's id, or the id ``apply_async``
        returned for a chord or a chain (its callback's or last link's, named before that
        task is recorded). Its members by submission time (at most
        ``limit``; ``truncated`` says there are more), progress, elapsed time, the members
        that block it and its own history, all derived from the members' records (index
        reads, never a scan). A task published alone is a workflow of one. ``None`` if
        ``task_id`` names nothing recorded (an id over the intake limits never is)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        read = self._workflow_read(task_id, limit)
        return None if read is None else derive(read, self._now())

    def _workflow_read(self, task_id: str, limit: int) -> WorkflowRead | None:
        if identity_over_limits(task_id, None):  # no key holds it: nothing to read
            return None
        return self.store.workflow(task_id, limit)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.store.now_ms() / 1000.0, tz=UTC)

    @_store_call
    def cancel_workflow(self, task_id: str, terminate: bool = False) -> list[str]:
        """Cancel every member of ``task_id``'s workflow that has not ended, as
        :meth:`cancel` does each (``terminate`` too), and mark the workflow cancelled: a
        member published after this (a chain's next step, a chord's callback) is
        cancelled as it is recorded, so it never runs. Returns the ids cancelled or whose
        cancellation was requested (running ones stop at their next heartbeat). A workflow
        that has ended is left as it is (nothing is marked)."""
        found = self._workflow_read(task_id, WORKFLOW_ACTION_LIMIT)
        if found is None or derive(found, self._now()).state is not WorkflowState.RUNNING:
            return []
        self.store.mark_workflow_cancelled(found.root_id, True)  # first: no member missed
        read = self.store.workflow(found.root_id, WORKFLOW_ACTION_LIMIT)
        done: list[str] = []
        for member in read.members if read is not None else ():
            if member.record.state not in TERMINAL and self.cancel(member.record.task_id,
                                                                   terminate):
                done.append(member.record.task_id)
        return done

    @_store_call
    def resubmit_workflow(self, task_id: str, reset_retry_count: bool = True) -> list[str]:
        """Resubmit the failed, stalled and dropped members of ``task_id``'s workflow (as
        :meth:`resubmit`; a chord header member's success then lets its callback run) and
        clear its cancel mark once some were resubmitted (a cancelled workflow with no such
        member stays cancelled: what its running members publish is still cancelled).
        Returns the ids resubmitted."""
        read = self._workflow_read(task_id, WORKFLOW_ACTION_LIMIT)
        if read is None:
            return []
        ids = [m.record.task_id for m in read.members if m.record.state in _FAILED_FOR_GOOD]
        if not ids:
            return []
        # the mark first: a resubmitted member's successors must not be cancelled as recorded
        self.store.mark_workflow_cancelled(read.root_id, False)
        return self.resubmit(ids, reset_retry_count)

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

def _pause_target(name: str | None, queue: str | None) -> tuple[PauseKind, object]:
    """Exactly one of a task name and a queue (else a :class:`PauseError`, as for a bad
    name: the REST API answers 400, the CLI exits 2)."""
    if (name is None) == (queue is None):
        raise PauseError("give either a task name or a queue")
    return (PauseKind.TASK, name) if name is not None else (PauseKind.QUEUE, queue)
