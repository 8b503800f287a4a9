"""The beat watch: each periodic schedule's expected slots against its actual runs.

Beat tells it what it schedules and what it publishes (:mod:`jobbers_celery.worker.periodic`
hooks the scheduler of any beat process that installed jobbers: the default one and
django-celery-beat's alike); workers tell it when a run starts and ends. Missed slots (beat
published nothing) and runs published but not started in time are found by :meth:`judge`,
which the workers' scheduler threads run every ``jobbers_periodic_check_interval``, one
worker at a time: not the cleaner, whose own pass is a beat task and stops with beat.

Each verdict is counted once (``periodic.lua``), then counted as a metric
(``periodic_runs_missed``, ``_late``, ``_overlapping``) and emitted as an alert
(``AlertKind.PERIODIC_*``, keyed by the schedule's name) by whoever counted it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobbers_celery.alerts.events import AlertEvent, AlertKind
from jobbers_celery.core.periodic import (
    MAX_DESCRIPTION,
    PeriodicSchedule,
    bounded,
    missed_slots,
)
from jobbers_celery.core.printable import escaped_logger, printable
from jobbers_celery.core.records import from_ms
from jobbers_celery.core.timefmt import human_time
from jobbers_celery.telemetry import metrics

if TYPE_CHECKING:
    from jobbers_celery.core.config import JobbersConfig
    from jobbers_celery.store.parts import PeriodicStore

__all__ = ["PERIODIC_PAGE", "JudgeReport", "PeriodicWatch", "ScheduleInfo"]

log = escaped_logger("jobbers.periodic")

#: The admin page that shows the schedules (an alert's link, under ``jobbers_admin_url``).
PERIODIC_PAGE = "jobbers/deadletterentry/live/periodic/"
#: A run recorded as running for longer than this is forgotten when the next one starts
#: (its worker most likely died without ending it): it no longer makes the next runs
#: overlap. A run that truly lasts longer overlaps unseen past this.
STALE_RUN_S = 3600


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One beat entry as the watch learns it (bounded by :func:`ScheduleInfo.of`)."""

    name: str
    task: str
    schedule: str
    #: Milliseconds between two slots (0: unknown, or a one-off).
    period_ms: int
    #: Milliseconds from now to the next slot (<= 0: due); ``None``: not known here.
    next_in_ms: int | None

    @classmethod
    def of(cls, name: object, task: object, schedule: object, period_ms: float,
           next_in_ms: float | None) -> ScheduleInfo:
        return cls(bounded(name), bounded(task), bounded(schedule, MAX_DESCRIPTION),
                   max(0, int(period_ms)), None if next_in_ms is None else int(next_in_ms))


@dataclass(frozen=True, slots=True)
class JudgeReport:
    """What one judgement found: missed slots and late runs, per schedule name."""

    missed: dict[str, int]
    late: dict[str, list[str]]


class PeriodicWatch:
    """Records what beat publishes and workers run, judges the slots, tells who listens."""

    def __init__(self, store: PeriodicStore, config: JobbersConfig,
                 emit: Callable[[AlertEvent], None] | None = None) -> None:
        self.store = store
        self.config = config
        self.emit = emit
        self.tolerance_ms = int(config.periodic_tolerance * 1000)
        self.keep = config.periodic_keep_runs
        self._next_check = 0.0
        self._full_logged = False

    # ------------------------------------------------------------------ learning
    def learn(self, entries: Sequence[ScheduleInfo], source: str, *,
              beat: str | None = None, complete: bool = False) -> None:
        """Record the schedules a beat (or a config) has; ``complete``: ``entries`` is all
        that beat schedules, so a watched beat schedule missing from it was removed."""
        names = set()
        for e in entries:
            names.add(e.name)
            fields = {"task": e.task, "desc": e.schedule, "source": source,
                      "period": str(e.period_ms)}
            if beat:
                fields["beat"] = bounded(beat)
            if not self.store.periodic_learn(e.name, fields, e.next_in_ms):
                self._full(e.name)
        if complete:
            for name in self.store.periodic_names():
                if (name not in names
                        and self.store.periodic_state(name).get("source") == source
                        and self.store.periodic_remove(name)):
                    log.info("periodic schedule %s is no longer scheduled by beat", name)

    def _full(self, name: str) -> None:
        if not self._full_logged:
            self._full_logged = True
            log.warning("periodic schedule %s is not watched: %d schedules are, the most "
                        "jobbers watches", name, len(self.store.periodic_names()))

    # ------------------------------------------------------------------ runs
    def published(self, info: ScheduleInfo, task_id: str, slot_in_ms: int) -> None:
        """Beat published ``task_id`` for ``info``'s slot ``slot_in_ms`` from now."""
        got = self.store.periodic_publish(info.name, task_id, info.task, slot_in_ms,
                                          info.next_in_ms, self.keep, self.tolerance_ms)
        if got == 0:
            self._full(info.name)
        elif got == 2:  # a worker started it before this publish was recorded: late
            self._tell(AlertKind.PERIODIC_LATE, "late", info.name, info.task, 1,
                       f"run {printable(task_id)} started more than "
                       f"{self.config.periodic_tolerance:g} s after its slot")

    def started(self, name: str, task_id: str, task: str, age_ms: float = 0) -> None:
        """A worker started a run of the schedule ``name`` ``age_ms`` ago (its writer sends
        it later): late? The times are the events', not the sends'."""
        name, task = bounded(name), bounded(task)
        late, overlapping = self.store.periodic_start(
            name, task_id, task, self.keep, self.tolerance_ms, STALE_RUN_S * 1000, age_ms)
        if late:
            self._tell(AlertKind.PERIODIC_LATE, "late", name, task, 1,
                       f"run {printable(task_id)} started more than "
                       f"{self.config.periodic_tolerance:g} s after its slot")
        self._overlapping(name, task, overlapping)

    def ended(self, name: str, task_id: str, state: str, age_ms: float = 0,
              task: str = "") -> None:
        """A run ended ``age_ms`` ago: the runs that started while it ran overlap."""
        name = bounded(name)
        ids = self.store.periodic_end(name, task_id, bounded(state, 40), age_ms)
        if ids:
            self._overlapping(name, bounded(task) or self.store.periodic_state(name).get(
                "task", ""), ids)

    def _overlapping(self, name: str, task: str, ids: Sequence[str]) -> None:
        for run in ids:
            self._tell(AlertKind.PERIODIC_OVERLAP, "overlapping", name, task, 1,
                       f"run {printable(run)} started while an earlier run still ran")

    # ------------------------------------------------------------------ judging
    def maybe_judge(self) -> JudgeReport | None:
        """:meth:`judge` if ``jobbers_periodic_check_interval`` passed since this process's
        last, and no other process judged within it (a short lock)."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        every = self.config.periodic_check_interval
        self._next_check = now + every
        if not self.store.try_lock("periodic-judge", int(every * 1000 * 0.9)):
            return None
        return self.judge()

    def judge(self) -> JudgeReport:
        """Count each watched schedule's missed slots and its runs not started in time."""
        store, tol = self.store, self.tolerance_ms
        missed: dict[str, int] = {}
        late: dict[str, list[str]] = {}
        for name in store.periodic_names():
            h = store.periodic_state(name)
            task = h.get("task", "")
            flagged = store.periodic_late(name, tol)
            if flagged:
                late[name] = flagged
                self._tell(AlertKind.PERIODIC_LATE, "late", name, task, len(flagged),
                           f"{len(flagged)} run(s) published but not started "
                           f"{self.config.periodic_tolerance:g} s after their slot")
            if h.get("removed_at") or not h.get("next_at"):
                continue
            judged = h.get("judged_to", "")
            slots = missed_slots(_int(h.get("next_at")), _int(h.get("period")),
                                 _int(judged), store.now_ms(), tol)
            n = store.periodic_missed(name, judged, slots, self.keep) if slots else 0
            if n:
                missed[name] = n
                first = from_ms(slots[0])
                self._tell(AlertKind.PERIODIC_MISSED, "missed", name, task, n,
                           f"{n} slot(s) from {human_time(first) if first else slots[0]} "
                           "passed with nothing published by beat")
        return JudgeReport(missed, late)

    def _tell(self, kind: AlertKind, metric: str, name: str, task: str, count: int,
              what: str) -> None:
        metrics.periodic(metric, name, task, count)
        log.warning("periodic schedule %s (%s): %s", name, task, what)
        if self.emit is None:
            return
        try:
            self.emit(AlertEvent(kind=kind, key=name,
                                 title=f"Periodic task {name}: {metric}",
                                 text=f"{task}: {what}", link=PERIODIC_PAGE, task_name=task))
        except Exception:  # an alert never affects the watch
            log.debug("could not emit the periodic alert", exc_info=True)

    # ------------------------------------------------------------------ reads
    def schedules(self, runs: int = 10) -> list[PeriodicSchedule]:
        """Every schedule watched, by name, with its newest ``runs`` runs."""
        return self.store.periodic_schedules(max(0, min(runs, self.keep)))


def _int(raw: str | None) -> int:
    try:
        return int(float(raw)) if raw else 0
    except ValueError:
        return 0
