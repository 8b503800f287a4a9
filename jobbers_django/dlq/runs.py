"""Paced resubmits on the Django sink, the control: start, pause, resume, cancel, continue
(a halted run), revive.
Publish a selection of dead letters at a rate, and halt when too many of them fail again,
so an unfixed cause is not hammered by a thousand tasks at once.

A run is a :class:`~jobbers_django.models.ResubmitRun` with one
:class:`~jobbers_django.models.ResubmitRunItem` per selected entry, driven in the background
by the Celery task ``jobbers.resubmit_run_step`` (:mod:`jobbers_django.tasks`), one bounded
step at a time (:mod:`jobbers_django.dlq.run_step`); the task re-enqueues itself with the
``countdown`` the step says, which waits in jobbers' Redis scheduler (no ETA message a
worker holds in memory), so a worker restart loses nothing. The pace, the stop rule and the
settle rule are the Redis sink's (:mod:`jobbers_celery.resubmit.pace`): one rule for both.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from jobbers_celery import (
    PaceError,
    ResubmitPace,
    ResubmitVersion,
    RunAction,
    control_sources,
    control_transition,
    escaped_logger,
)
from jobbers_django import bridge
from jobbers_django.dlq.actions import version_choice
from jobbers_django.dlq.selection import Selection, SelectionError, candidates, current_versions
from jobbers_django.models import (
    FINAL_STATUSES,
    Action,
    DeadLetterAudit,
    ResubmitRun,
    ResubmitRunItem,
    RunStatus,
    Source,
    VersionChoice,
)

__all__ = [
    "MAX_RATE",
    "MAX_WINDOW",
    "MIN_RATE",
    "STEP_TASK",
    "Pace",
    "RunConflict",
    "active",
    "audit",
    "cancel",
    "continue_run",
    "enqueue",
    "pause",
    "resume",
    "revive",
    "runs_per_group",
    "start",
    "summary",
    "window_start",
]

log = escaped_logger("jobbers.django.runs")

#: The Celery task that drives runs (:mod:`jobbers_django.tasks`).
STEP_TASK = "jobbers.resubmit_run_step"
#: Fastest and slowest pace (tasks per second) and largest stop-rule window (``of_last``):
#: the Redis sink's bounds, one rule for both sinks.
MAX_RATE, MIN_RATE, MAX_WINDOW = ResubmitPace.max_rate, ResubmitPace.min_rate, \
    ResubmitPace.max_window


class RunConflict(Exception):
    """The run is not in a status the request applies to (e.g. resuming a cancelled run)."""


@dataclass(frozen=True)
class Pace:
    """A rate (tasks per second) and an optional stop rule: halt when more than
    ``halt_after`` of the last ``of_last`` settled tasks failed again."""

    rate: float
    halt_after: int | None = None
    of_last: int | None = None

    def __post_init__(self) -> None:
        try:  # the Redis sink's checks: one rule for both sinks
            ResubmitPace(self.rate, self.halt_after, self.of_last)
        except PaceError as exc:
            raise SelectionError(exc.field, exc.message) from None


def start(selection: Selection, pace: Pace, *, reset_retry_count: bool = True,
          version: str = VersionChoice.ENTRY, user: Any = None,
          source: str = Source.CODE) -> ResubmitRun:
    """Create a run of the dead, publishable entries ``selection`` takes now (at most its
    cap, newest first), audit it, and enqueue its first step once committed. Entries stay
    dead until a step publishes them (a run cancelled early leaves the rest dead)."""
    choice = version_choice(version)
    if choice is ResubmitVersion.CURRENT:
        current_versions(selection)  # a SelectionError before anything changes
    real_user = user if getattr(user, "is_authenticated", False) else None
    with transaction.atomic():
        rows = list(candidates(selection, publishable_only=True)
                    .values_list("pk", "task_id")[: selection.cap])
        run = ResubmitRun.objects.create(
            user=real_user, username=real_user.get_username() if real_user else "",
            source=source,
            task_ids=list(selection.task_ids) if selection.task_ids is not None else None,
            filters=selection.describe() if selection.task_ids is None else None,
            limit=selection.limit if selection.task_ids is None else None,
            reset_retry_count=reset_retry_count, version=choice.value, rate=pace.rate,
            halt_after=pace.halt_after, of_last=pace.of_last, total=len(rows),
            remaining=len(rows), chain=uuid.uuid4().hex)
        ResubmitRunItem.objects.bulk_create(
            ResubmitRunItem(run=run, entry_id=pk, task_id=task_id, position=i)
            for i, (pk, task_id) in enumerate(rows))
        audit(run, Action.RUN_START, user=real_user, source=source,
              detail=f"{len(rows)} entries at {pace.rate:g}/s; {run.rule}",
              task_ids=[t for _, t in rows])
        transaction.on_commit(functools.partial(_enqueue_soon, run.pk, run.chain))
    return run


def pause(run_id: int, *, user: Any = None, source: str = Source.CODE) -> ResubmitRun:
    """Stop publishing; what was published is still followed to its outcome."""
    return _move(run_id, RunAction.PAUSE, {}, user=user, source=source)


def resume(run_id: int, *, user: Any = None, source: str = Source.CODE) -> ResubmitRun:
    """Publish again from where the run paused, at its pace counted from now; a new step
    chain is started (the paused one has stopped or stops at its next step)."""
    chain = uuid.uuid4().hex
    run = _move(run_id, RunAction.RESUME,
                {"chain": chain, "paced_since": timezone.now(),
                 "published_base": F("published")}, user=user, source=source)
    transaction.on_commit(functools.partial(_enqueue_soon, run_id, chain))
    return run


def cancel(run_id: int, *, user: Any = None, source: str = Source.CODE) -> ResubmitRun:
    """Publish nothing more; the unpublished entries stay dead."""
    return _move(run_id, RunAction.CANCEL, {"finished_at": timezone.now()},
                 user=user, source=source)


#: How a continue's audit detail starts (audited as a resume: the audit's actions are a
#: model choice, and a new one would need a migration); the stop rule's window starts at
#: the newest such audit (:func:`window_start`).
CONTINUED = "continued after a halt"


def continue_run(run_id: int, *, user: Any = None, source: str = Source.CODE) -> ResubmitRun:
    """A halted run goes on, its cause fixed: at its pace counted from now, with a new step
    chain; its stop rule counts only what settles from now on (the failures that halted it
    are not counted again). The halt's reason stays in the audit."""
    before = ResubmitRun.objects.filter(pk=run_id).values_list("halt_reason", flat=True).first()
    chain = uuid.uuid4().hex
    run = _move(run_id, RunAction.CONTINUE,
                {"chain": chain, "paced_since": timezone.now(),
                 "published_base": F("published"), "halt_reason": "", "finished_at": None},
                user=user, source=source, detail=f"{CONTINUED}: {before or ''}")
    transaction.on_commit(functools.partial(_enqueue_soon, run_id, chain))
    return run


def runs_per_group(fingerprints: Iterable[str]) -> dict[str, int]:
    """How many paced resubmits were started for each of these failure groups (a run's
    selection names its group's fingerprint), in one query."""
    wanted = list(fingerprints)
    if not wanted:
        return {}
    rows = (ResubmitRun.objects.filter(task_ids__isnull=True,
                                       filters__fingerprint__in=wanted)
            .values("filters__fingerprint").annotate(n=Count("pk")))
    return {str(r["filters__fingerprint"]): int(r["n"]) for r in rows}


def window_start(run: ResubmitRun) -> datetime | None:
    """When the run's stop-rule window starts: its last continue (``None``: its start)."""
    return DeadLetterAudit.objects.filter(
        run=run, action=Action.RUN_RESUME, detail__startswith=CONTINUED).order_by(
        "-at", "-id").values_list("at", flat=True).first()


#: Each control's audit action, and its past tense (for a refusal).
_AUDITED: dict[RunAction, tuple[str, str]] = {
    RunAction.PAUSE: (Action.RUN_PAUSE, "paused"),
    RunAction.RESUME: (Action.RUN_RESUME, "resumed"),
    RunAction.CANCEL: (Action.RUN_CANCEL, "cancelled"),
    RunAction.CONTINUE: (Action.RUN_RESUME, "continued"),
}


def _move(run_id: int, action: RunAction, update: dict[str, Any], *,
          user: Any, source: str, detail: str = "") -> ResubmitRun:
    """One conditional UPDATE by the control table both sinks use
    (``jobbers_celery.control_transition``): of two operators pressing the same button,
    one moves the run (and is audited), the other gets :class:`RunConflict`."""
    real_user = user if getattr(user, "is_authenticated", False) else None
    sources = [s.value for s in RunStatus if s.value in control_sources(action)]
    target = control_transition(sources[0], action)
    assert target is not None  # every action applies to some status
    audited, verb = _AUDITED[action]
    with transaction.atomic():
        moved = ResubmitRun.objects.filter(pk=run_id, status__in=sources).update(
            status=target.value, **update)
        run = ResubmitRun.objects.get(pk=run_id)  # DoesNotExist: the caller's 404
        if not moved:
            raise RunConflict(f"run {run_id} is {run.status}: it can be "
                              f"{verb} only when {' or '.join(sources)}")
        audit(run, audited, user=real_user, source=source, detail=detail)
    return run


def revive(stale_after: timedelta = timedelta(seconds=60)) -> list[int]:
    """Start a new step chain for every queued or running run whose last step (or start)
    is older than ``stale_after``: its chain ended without finishing it (the step task
    failed for good, or was never sent because the broker was down). The old chain, if it
    is only late, stops at its next step. Returns the runs revived."""
    cutoff = timezone.now() - stale_after
    stale = ResubmitRun.objects.filter(
        status__in=(RunStatus.QUEUED, RunStatus.RUNNING)).filter(
        Q(last_step_at__lt=cutoff) | Q(last_step_at__isnull=True, created_at__lt=cutoff))
    revived = []
    for run_id in stale.values_list("pk", flat=True):
        chain = uuid.uuid4().hex
        if ResubmitRun.objects.filter(pk=run_id).filter(
                Q(last_step_at__lt=cutoff) | Q(last_step_at__isnull=True)).update(
                chain=chain, last_step_at=timezone.now()):  # not revived again at once
            log.warning("paced resubmit %s had no step for %s: starting a new step chain",
                        run_id, stale_after)
            transaction.on_commit(functools.partial(_enqueue_soon, run_id, chain))
            revived.append(run_id)
    return revived


def _enqueue_soon(run_id: int, chain: str) -> None:
    """The first step of a chain, after the commit. The run is committed already: if the
    broker cannot take the step now, ``revive`` starts the run later (logged, not raised)."""
    try:
        enqueue(run_id, chain)
    except Exception:
        log.exception("paced resubmit %s: its first step could not be sent; "
                      "jobbers_publish_pending starts it within a minute or so", run_id)


def enqueue(run_id: int, chain: str, countdown: float | None = None) -> None:
    """Send the run's next step (with ``countdown``: it waits in jobbers' scheduler)."""
    task = bridge.get_app().tasks[STEP_TASK]
    if countdown:
        task.apply_async((run_id, chain), countdown=countdown)
    else:
        task.apply_async((run_id, chain))


def summary(run: ResubmitRun) -> str:
    """A run's outcome in one line (the audit's detail when it ends)."""
    return (f"{run.published} published: {run.completed} completed, {run.failed_again} "
            f"failed again, {run.published - run.completed - run.failed_again} otherwise "
            f"(refused or ended otherwise); {run.skipped} skipped")


def audit(run: ResubmitRun, action: str, *, user: Any, source: str, detail: str = "",
          task_ids: list[str] | None = None) -> DeadLetterAudit:
    """Audit ``action`` on ``run``; when it ends, with the task ids it published."""
    acted: list[str] = []
    if action in (Action.RUN_DONE, Action.RUN_HALT, Action.RUN_CANCEL):
        acted = list(ResubmitRunItem.objects.filter(run=run, published_at__isnull=False)
                     .order_by("position").values_list("task_id", flat=True))
    return DeadLetterAudit.objects.create(
        user=user, username=user.get_username() if user else "", source=source,
        action=action, task_ids=run.task_ids, filters=run.filters, limit=run.limit,
        reset_retry_count=run.reset_retry_count, version=run.version,
        matched=run.total if task_ids is None else len(task_ids), acted=len(acted),
        acted_ids=acted, run=run, detail=detail or (
            summary(run) if action in (Action.RUN_CANCEL,) else ""))


def active(runs: QuerySet[ResubmitRun] | None = None) -> QuerySet[ResubmitRun]:
    """Runs still to move (not halted, cancelled or done)."""
    return (runs if runs is not None else ResubmitRun.objects.all()).exclude(
        status__in=FINAL_STATUSES)
