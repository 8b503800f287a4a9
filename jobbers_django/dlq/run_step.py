"""One step of a paced resubmit on the Django sink (what ``jobbers.resubmit_run_step`` runs).

One step, in one transaction holding the run's row lock (two steps of a run never overlap):

1. settle the published items by the one settle rule both sinks use
   (``jobbers_celery.run_outcome``): failed again (the entry's failure count grew since its
   publish, or the jobbers record says failed, dropped, stalled or cancelled), completed
   (the record says so), ended otherwise (the record expired);
2. apply the stop rule (``jobbers_celery.stop_rule``): more than ``halt_after`` of the last
   ``of_last`` settled items failed again -> ``halted``, with why;
3. claim the items due by the pace (``SELECT ... FOR UPDATE SKIP LOCKED`` on items still
   unpublished, their entries still dead), set their ``published_at`` and mark the entries
   resubmitted, as :func:`jobbers_django.dlq.actions.resubmit` does;
4. recount the counters from the items; ``done`` once all are published and settled.

The messages go out after the commit (``on_commit``); a publish that never ran is finished
by :func:`~jobbers_django.dlq.actions.publish_pending`. So each entry is published at most
once per run, however many steps, operators or restarts race.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from jobbers_celery import ResubmitPace, RunOutcome, escaped_logger, run_outcome, stop_rule
from jobbers_django import bridge
from jobbers_django.dlq import actions
from jobbers_django.dlq.runs import audit, summary, window_start
from jobbers_django.dlq.selection import publishable
from jobbers_django.models import (
    Action,
    DeadLetterEntry,
    ItemOutcome,
    ResubmitRun,
    ResubmitRunItem,
    RunStatus,
    Source,
    Status,
)

__all__ = ["ITEM_OUTCOMES", "step"]

log = escaped_logger("jobbers.django.runs")

#: Seconds between steps while publishing, and while only reading outcomes.
STEP_INTERVAL = 0.5
SETTLE_INTERVAL = 1.0
#: Most items one step publishes, and settles.
MAX_BATCH = 500
MAX_SETTLE = 500

#: The settled outcomes as an item keeps them: the settle rule's outcome, and the model's
#: member (``ItemOutcome.OTHER`` keeps its public name: a Django enum has no alias).
ITEM_OUTCOMES: dict[RunOutcome, ItemOutcome] = {
    RunOutcome.COMPLETED: ItemOutcome.COMPLETED,
    RunOutcome.FAILED_AGAIN: ItemOutcome.FAILED_AGAIN,
    RunOutcome.ENDED_OTHERWISE: ItemOutcome.OTHER,
}
_RUN_OUTCOMES = {item: run for run, item in ITEM_OUTCOMES.items()}


def step(run_id: int, chain: str) -> float | None:
    """One bounded step of the run (see the module docstring); the seconds until the next
    one, or ``None`` when the chain ends (finished, paused with nothing in flight, or
    ``chain`` is not the run's current one)."""
    publish: list[int] = []
    actions.publish_pending()  # a publish a restart cut short (this run's or another's)
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
                audit(run, Action.RUN_HALT, user=None, source=Source.CODE, detail=why)
        if run.status == RunStatus.RUNNING:
            publish = _claim(run, _due(run, now), now)
        unsettled = _recount(run)
        if run.status == RunStatus.RUNNING and run.remaining == 0 and unsettled == 0:
            run.status, run.finished_at = RunStatus.DONE, now
            audit(run, Action.RUN_DONE, user=None, source=Source.CODE, detail=summary(run))
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
    entries = publishable(DeadLetterEntry.objects.filter(status=Status.DEAD))
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
        actions.mark_resubmitted([dead[e] for e in taken], now)
    return taken


def _publish(run_id: int, entry_pks: list[int], reset_retry_count: bool,
             version: str) -> None:
    """After the claim committed: publish the claimed entries, settle the refused ones."""
    def refused(pks: list[int]) -> None:
        ResubmitRunItem.objects.filter(
            run_id=run_id, entry_id__in=pks, outcome=ItemOutcome.PENDING).update(
            outcome=ItemOutcome.REFUSED, settled_at=timezone.now())

    try:
        actions.publish(entry_pks, reset_retry_count, version, refused=refused)
    except Exception:
        # Committed as resubmitted, not published (Redis or the broker is down): the
        # entries stay publish_pending for publish_pending() to finish.
        log.exception("paced resubmit %s: publishing %d entries failed; they stay pending "
                      "for publish_pending()", run_id, len(entry_pks))


def _settle(run: ResubmitRun, now: datetime) -> None:
    """Read the outcome of published items not settled yet (oldest first, bounded), by the
    one settle rule (``run_outcome``)."""
    pending = list(ResubmitRunItem.objects.filter(
        run=run, published_at__isnull=False, outcome=ItemOutcome.PENDING)
        .select_related("entry").only("pk", "task_id", "failures_before",
                                      "entry__failure_count", "entry__publish_pending")
        .order_by("position")[:MAX_SETTLE])
    # an entry whose publish has not run yet still shows its old failure: not yet
    pending = [i for i in pending if not i.entry.publish_pending]
    if not pending:
        return
    # one batched read of the records, not one round trip per item under the row lock
    states = bridge.get_jobbers().states_of(
        i.task_id for i in pending if i.entry.failure_count <= i.failures_before)
    outcomes: dict[ItemOutcome, list[int]] = {}
    for item in pending:
        if item.entry.failure_count > item.failures_before:  # dead-lettered again
            found: RunOutcome | None = RunOutcome.FAILED_AGAIN
        else:
            found, _ = run_outcome(*(states.get(item.task_id) or (None, None)))
        if found in ITEM_OUTCOMES:
            outcomes.setdefault(ITEM_OUTCOMES[found], []).append(item.pk)
    for outcome, pks in outcomes.items():
        ResubmitRunItem.objects.filter(pk__in=pks, outcome=ItemOutcome.PENDING).update(
            outcome=outcome, settled_at=now)


def _stop_rule(run: ResubmitRun) -> str:
    """Why the run must halt (its stop rule is met), or ``""``. A continued run counts
    only what settled since its last continue (:func:`~jobbers_django.dlq.runs.window_start`)."""
    if run.halt_after is None or run.of_last is None:
        return ""
    settled = ResubmitRunItem.objects.filter(run=run, outcome__in=list(_RUN_OUTCOMES))
    since = window_start(run)
    if since is not None:
        settled = settled.filter(settled_at__gte=since)
    last = settled.order_by(
        "-settled_at", "-position").values_list("outcome", flat=True)[: run.of_last]
    return stop_rule([_RUN_OUTCOMES[ItemOutcome(o)] for o in last], run.halt_after,
                     run.of_last)


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
