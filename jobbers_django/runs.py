"""Paced resubmits: publish a selection of dead letters at a rate, and halt when too many of
them fail again, so an unfixed cause is not hammered by a thousand tasks at once.

A run is a :class:`~jobbers_django.models.ResubmitRun` with one
:class:`~jobbers_django.models.ResubmitRunItem` per selected entry, driven in the background
by the Celery task ``jobbers.resubmit_run_step`` (:mod:`jobbers_django.tasks`). Each call of
:func:`step` does one bounded piece of work and says when the next is due; the task
re-enqueues itself with that ``countdown``, which waits in jobbers' Redis scheduler (no ETA
message a worker holds in memory), so a worker restart loses nothing.

One step, in one transaction holding the run's row lock (two steps of a run never overlap):

1. settle the published items: failed again (the entry's failure count grew since its
   publish, or the jobbers record says failed or dropped), completed (the record says so),
   ended otherwise (cancelled, or the record expired);
2. apply the stop rule: more than ``halt_after`` of the last ``of_last`` settled items failed
   again -> ``halted``, with why;
3. claim the items due by the pace (``SELECT ... FOR UPDATE SKIP LOCKED`` on items still
   unpublished, their entries still dead), set their ``published_at`` and mark the entries
   resubmitted, as :func:`jobbers_django.services.resubmit` does;
4. recount the counters from the items; ``done`` once all are published and settled.

The messages go out after the commit (``on_commit``); a publish that never ran is finished
by ``services.publish_pending``. So each entry is published at most once per run, however
many steps, operators or restarts race.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from jobbers_celery import PaceError, ResubmitPace, escaped_logger
from jobbers_django import services
from jobbers_django.models import (
    FINAL_STATUSES,
    Action,
    DeadLetterAudit,
    DeadLetterEntry,
    ItemOutcome,
    ResubmitRun,
    ResubmitRunItem,
    RunStatus,
    Source,
    Status,
    VersionChoice,
)

__all__ = [
    "MAX_RATE",
    "MAX_WINDOW",
    "MIN_RATE",
    "STEP_TASK",
    "Pace",
    "RunConflict",
    "cancel",
    "enqueue",
    "pause",
    "resume",
    "revive",
    "start",
    "step",
]

log = escaped_logger("jobbers.django.runs")

#: The Celery task that drives runs (:mod:`jobbers_django.tasks`).
STEP_TASK = "jobbers.resubmit_run_step"
#: Seconds between steps while publishing, and while only reading outcomes.
STEP_INTERVAL = 0.5
SETTLE_INTERVAL = 1.0
#: Most items one step publishes, and settles.
MAX_BATCH = 500
MAX_SETTLE = 500
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
            raise services.SelectionError(exc.field, exc.message) from None


# ---------------------------------------------------------------------- control
def start(selection: services.Selection, pace: Pace, *, reset_retry_count: bool = True,
          version: str = VersionChoice.ENTRY, user: Any = None,
          source: str = Source.CODE) -> ResubmitRun:
    """Create a run of the dead, publishable entries ``selection`` takes now (at most its
    cap, newest first), audit it, and enqueue its first step once committed. Entries stay
    dead until a step publishes them (a run cancelled early leaves the rest dead)."""
    from jobbers_celery import ResubmitVersion

    try:
        choice = ResubmitVersion(version)
    except ValueError:
        raise services.SelectionError("version", f"must be one of "
                                      f"{', '.join(ResubmitVersion)}") from None
    if choice is ResubmitVersion.CURRENT:
        services._current_versions(selection)  # a SelectionError before anything changes
    real_user = user if getattr(user, "is_authenticated", False) else None
    with transaction.atomic():
        rows = list(services._candidates(selection, publishable=True)
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
        _audit(run, Action.RUN_START, user=real_user, source=source,
               detail=f"{len(rows)} entries at {pace.rate:g}/s; {run.rule}",
               task_ids=[t for _, t in rows])
        transaction.on_commit(functools.partial(_enqueue_soon, run.pk, run.chain))
    return run


def pause(run_id: int, *, user: Any = None, source: str = Source.CODE) -> ResubmitRun:
    """Stop publishing; what was published is still followed to its outcome."""
    return _move(run_id, Action.RUN_PAUSE, (RunStatus.QUEUED, RunStatus.RUNNING),
                 {"status": RunStatus.PAUSED}, user=user, source=source)


def resume(run_id: int, *, user: Any = None, source: str = Source.CODE) -> ResubmitRun:
    """Publish again from where the run paused, at its pace counted from now; a new step
    chain is started (the paused one has stopped or stops at its next step)."""
    chain = uuid.uuid4().hex
    run = _move(run_id, Action.RUN_RESUME, (RunStatus.PAUSED,),
                {"status": RunStatus.RUNNING, "chain": chain, "paced_since": timezone.now(),
                 "published_base": F("published")}, user=user, source=source)
    transaction.on_commit(functools.partial(_enqueue_soon, run_id, chain))
    return run


def cancel(run_id: int, *, user: Any = None, source: str = Source.CODE) -> ResubmitRun:
    """Publish nothing more; the unpublished entries stay dead."""
    return _move(run_id, Action.RUN_CANCEL,
                 (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PAUSED),
                 {"status": RunStatus.CANCELLED, "finished_at": timezone.now()},
                 user=user, source=source)


def _move(run_id: int, action: str, sources: Sequence[str], update: dict[str, Any], *,
          user: Any, source: str) -> ResubmitRun:
    """One conditional UPDATE: of two operators pressing the same button, one moves the
    run (and is audited), the other gets :class:`RunConflict`."""
    real_user = user if getattr(user, "is_authenticated", False) else None
    with transaction.atomic():
        moved = ResubmitRun.objects.filter(pk=run_id, status__in=sources).update(**update)
        run = ResubmitRun.objects.get(pk=run_id)  # DoesNotExist: the caller's 404
        if not moved:
            raise RunConflict(f"run {run_id} is {run.status}: it can be "
                              f"{_verb(action)} only when {' or '.join(sources)}")
        _audit(run, action, user=real_user, source=source)
    return run


def _verb(action: str) -> str:
    verbs: dict[str, str] = {Action.RUN_PAUSE: "paused", Action.RUN_RESUME: "resumed",
                             Action.RUN_CANCEL: "cancelled"}
    return verbs.get(action, action)


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
    task = services.get_app().tasks[STEP_TASK]
    if countdown:
        task.apply_async((run_id, chain), countdown=countdown)
    else:
        task.apply_async((run_id, chain))


# ---------------------------------------------------------------------- the step
def step(run_id: int, chain: str) -> float | None:
    """One bounded step of the run (see the module docstring); the seconds until the next
    one, or ``None`` when the chain ends (finished, paused with nothing in flight, or
    ``chain`` is not the run's current one)."""
    publish: list[int] = []
    services.publish_pending()  # a publish a restart cut short (this run's or another's)
    with transaction.atomic():
        run = ResubmitRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.chain != chain:
            return None
        now = timezone.now()
        run.last_step_at = now
        if run.status == RunStatus.QUEUED:
            run.status, run.started_at = RunStatus.RUNNING, now
            run.paced_since, run.published_base = now, 0
        _settle(run, now)
        if run.status == RunStatus.RUNNING:
            why = _stop_rule(run)
            if why:
                run.status, run.halt_reason, run.finished_at = RunStatus.HALTED, why, now
                _audit(run, Action.RUN_HALT, user=None, source=Source.CODE, detail=why)
        if run.status == RunStatus.RUNNING:
            publish = _claim(run, _due(run, now), now)
        unsettled = _recount(run)
        if run.status == RunStatus.RUNNING and run.remaining == 0 and unsettled == 0:
            run.status, run.finished_at = RunStatus.DONE, now
            _audit(run, Action.RUN_DONE, user=None, source=Source.CODE, detail=_outcome(run))
        run.save()
        if publish:
            reset, version = run.reset_retry_count, run.version
            transaction.on_commit(lambda: _publish(run_id, publish, reset, version))
    if run.status == RunStatus.RUNNING:
        return STEP_INTERVAL if run.remaining else SETTLE_INTERVAL
    return SETTLE_INTERVAL if unsettled else None


def _due(run: ResubmitRun, now: datetime) -> int:
    """Items the pace allows now: one at once, then ``rate`` per second since the run
    (re)started, less those published since; at most ``MAX_BATCH``."""
    since = run.paced_since or now
    allowed = ResubmitPace.allowance(run.rate, (now - since).total_seconds())
    return max(0, min(MAX_BATCH, allowed - (run.published - run.published_base)))


def _claim(run: ResubmitRun, due: int, now: datetime) -> list[int]:
    """Claim up to ``due`` unpublished items whose entries are still dead: mark the entries
    resubmitted and the items published, in this transaction. Rows another transaction
    holds are skipped, and ``published_at IS NULL`` is the UPDATE's condition: an item is
    claimed once. Items whose entry is no longer dead are settled as skipped. Returns the
    entry pks to publish after the commit."""
    if due <= 0:
        return []
    items = ResubmitRunItem.objects.filter(run=run, published_at__isnull=True,
                                           outcome=ItemOutcome.PENDING).order_by("position")
    # sealed with a payload key this process does not hold: skipped, never published sealed
    entries = services._openable(DeadLetterEntry.objects.filter(status=Status.DEAD).exclude(
        options__has_key=services._unpublishable_key()))
    if connection.features.has_select_for_update_skip_locked:
        items = items.select_for_update(skip_locked=True, of=("self",))
        entries = entries.select_for_update(skip_locked=True, of=("self",))
    claimed = list(items.values_list("pk", "entry_id")[:due])
    if not claimed:
        return []
    # no payloads read here: the publish after the commit reads them
    dead = {e.pk: e for e in entries.filter(pk__in=[e for _, e in claimed])
            .only("pk", "failure_count", "fingerprint")}
    go = [(item, entry) for item, entry in claimed if entry in dead]
    gone = [item for item, entry in claimed if entry not in dead]
    if gone:
        ResubmitRunItem.objects.filter(pk__in=gone, published_at__isnull=True).update(
            outcome=ItemOutcome.SKIPPED, settled_at=now)
    taken: list[int] = []
    for item, entry in go:
        if ResubmitRunItem.objects.filter(pk=item, published_at__isnull=True).update(
                published_at=now, failures_before=dead[entry].failure_count):
            taken.append(entry)
    if taken:
        DeadLetterEntry.objects.filter(pk__in=taken).update(
            status=Status.RESUBMITTED, resubmit_count=F("resubmit_count") + 1,
            resubmitted_at=now, publish_pending=True)
        services._leave_dead([dead[e] for e in taken])
    return taken


def _publish(run_id: int, entry_pks: list[int], reset_retry_count: bool,
             version: str) -> None:
    """After the claim committed: publish, and settle the tasks jobbers refused."""
    try:
        published = set(services._publish(entry_pks, reset_retry_count, version))
    except Exception:
        # Committed as resubmitted, not published (Redis or the broker is down): the
        # entries stay publish_pending for services.publish_pending() to finish.
        log.exception("paced resubmit %s: publishing %d entries failed; they stay pending "
                      "for publish_pending()", run_id, len(entry_pks))
        return
    refused = (ResubmitRunItem.objects.filter(run_id=run_id, entry_id__in=entry_pks)
               .exclude(task_id__in=published))
    refused.filter(outcome=ItemOutcome.PENDING).update(outcome=ItemOutcome.REFUSED,
                                                       settled_at=timezone.now())


def _settle(run: ResubmitRun, now: datetime) -> None:
    """Read the outcome of published items not settled yet (oldest first, bounded)."""
    from jobbers_celery import TaskState

    pending = list(ResubmitRunItem.objects.filter(
        run=run, published_at__isnull=False, outcome=ItemOutcome.PENDING)
        .select_related("entry").only("pk", "task_id", "failures_before",
                                      "entry__failure_count", "entry__publish_pending")
        .order_by("position")[:MAX_SETTLE])
    # an entry whose publish has not run yet still shows its old failure: not yet
    pending = [i for i in pending if not i.entry.publish_pending]
    if not pending:
        return
    jobbers = services.get_jobbers()
    outcomes: dict[str, list[int]] = {}
    for item in pending:
        outcome = ""
        if item.entry.failure_count > item.failures_before:
            outcome = ItemOutcome.FAILED_AGAIN
        else:
            record = jobbers.get(item.task_id)
            if record is None:
                outcome = ItemOutcome.OTHER
            elif record.state == TaskState.COMPLETED:
                outcome = ItemOutcome.COMPLETED
            elif record.state in (TaskState.FAILED, TaskState.DROPPED):
                outcome = ItemOutcome.FAILED_AGAIN
            elif record.state == TaskState.CANCELLED:
                outcome = ItemOutcome.OTHER
        if outcome:
            outcomes.setdefault(outcome, []).append(item.pk)
    for outcome, pks in outcomes.items():
        ResubmitRunItem.objects.filter(pk__in=pks, outcome=ItemOutcome.PENDING).update(
            outcome=outcome, settled_at=now)


def _stop_rule(run: ResubmitRun) -> str:
    """Why the run must halt (its stop rule is met), or ``""``."""
    if run.halt_after is None or run.of_last is None:
        return ""
    last = list(ResubmitRunItem.objects.filter(
        run=run, outcome__in=(ItemOutcome.COMPLETED, ItemOutcome.FAILED_AGAIN,
                              ItemOutcome.OTHER))
        .order_by("-settled_at", "-position").values_list("outcome", flat=True)[: run.of_last])
    failed = sum(1 for o in last if o == ItemOutcome.FAILED_AGAIN)
    if failed <= run.halt_after:
        return ""
    return (f"{failed} of the last {len(last)} resubmitted tasks failed again (the rule: "
            f"halt when more than {run.halt_after} of the last {run.of_last})")


def _counts(run: ResubmitRun) -> dict[str, int]:
    items = ResubmitRunItem.objects.filter(run=run)
    return items.aggregate(
        total=Count("pk"),
        published=Count("pk", filter=Q(published_at__isnull=False)),
        completed=Count("pk", filter=Q(outcome=ItemOutcome.COMPLETED)),
        failed_again=Count("pk", filter=Q(outcome=ItemOutcome.FAILED_AGAIN)),
        skipped=Count("pk", filter=Q(outcome=ItemOutcome.SKIPPED)),
        remaining=Count("pk", filter=Q(published_at__isnull=True,
                                       outcome=ItemOutcome.PENDING)),
        settled_published=Count("pk", filter=Q(published_at__isnull=False)
                                & ~Q(outcome=ItemOutcome.PENDING)),
    )


def _recount(run: ResubmitRun) -> int:
    """Set the run's counters from its items; returns the published items not settled."""
    counts = _counts(run)
    settled = counts.pop("settled_published")
    for name, value in counts.items():
        setattr(run, name, value)
    return run.published - settled


def _outcome(run: ResubmitRun) -> str:
    return (f"{run.published} published: {run.completed} completed, {run.failed_again} "
            f"failed again, {run.published - run.completed - run.failed_again} otherwise "
            f"(refused or ended otherwise); {run.skipped} skipped")


def _audit(run: ResubmitRun, action: str, *, user: Any, source: str, detail: str = "",
           task_ids: list[str] | None = None) -> DeadLetterAudit:
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
            _outcome(run) if action in (Action.RUN_CANCEL,) else ""))


def active(runs: QuerySet[ResubmitRun] | None = None) -> QuerySet[ResubmitRun]:
    """Runs still to move (not halted, cancelled or done)."""
    return (runs if runs is not None else ResubmitRun.objects.all()).exclude(
        status__in=FINAL_STATUSES)
