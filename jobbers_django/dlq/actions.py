"""Resubmit and discard dead letters of the Django sink: what the admin, the API and the
command line do (neither changes the dead-letter tables on its own).

Resubmission: the entries are claimed in one transaction (``SELECT ... FOR UPDATE SKIP
LOCKED`` where the status is still ``dead``), marked ``resubmitted`` and audited; the
messages are published only after that transaction commits (:func:`publish`). So two
requests racing for the same entries resubmit each at most once, and a rolled-back request
publishes nothing. ``jobbers_celery`` then moves each task ``failed -> submitted`` with a
compare-and-set step, a second guard against a double publish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, F, IntegerField, Value, When
from django.utils import timezone

from jobbers_celery import (
    UNPUBLISHABLE,
    DeadLetter,
    ResubmitVersion,
    escaped_logger,
    publish_claimed,
)
from jobbers_django import bridge, conf
from jobbers_django.dlq.selection import (
    Selection,
    SelectionError,
    candidates,
    current_versions,
)
from jobbers_django.models import (
    Action,
    DeadLetterAudit,
    DeadLetterEntry,
    FailureGroup,
    Source,
    Status,
    VersionChoice,
)

__all__ = ["ActionResult", "discard", "leave_dead", "mark_resubmitted", "publish",
           "publish_pending", "resubmit", "resubmit_workflow", "version_choice"]

log = escaped_logger("jobbers.django")

SAMPLE_SIZE = 10


@dataclass
class ActionResult:
    """What an action did, or (``dry_run``) would do.

    ``matched``: dead entries selected (at most ``limit``); ``more``: more would match
    beyond ``limit``; ``acted``: ids resubmitted or discarded; ``skipped``: requested ids
    that were not acted on, with why; ``published``: ids whose message went out (``None``
    while the publish waits for an enclosing transaction to commit).
    """

    action: str
    dry_run: bool
    matched: int = 0
    more: bool = False
    acted: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    sample: list[DeadLetterEntry] = field(default_factory=list)
    published: list[str] | None = None
    audit_id: int | None = None


def version_choice(version: str, *, got: bool = False) -> ResubmitVersion:
    """``version`` as a :class:`ResubmitVersion`, else a ``SelectionError`` on it."""
    try:
        return ResubmitVersion(version)
    except ValueError:
        said = f", got {version!r}" if got else ""
        raise SelectionError("version", f"must be one of {', '.join(ResubmitVersion)}"
                             f"{said}") from None


def _skipped(selection: Selection, acted: Sequence[str]) -> list[dict[str, str]]:
    if selection.task_ids is None:
        return []
    rest = [i for i in dict.fromkeys(selection.task_ids) if i not in set(acted)]
    if not rest:
        return []
    codec = bridge.payload_codec()
    status: dict[str, str] = {}
    unpublishable: dict[str, str] = {}
    for task_id, state, options, args, kwargs in (
            DeadLetterEntry.objects.filter(task_id__in=rest)
            .values_list("task_id", "status", "options", "args", "kwargs")):
        status[task_id] = state
        if state == Status.DEAD and isinstance(options, dict) and options.get(UNPUBLISHABLE):
            unpublishable[task_id] = str(options[UNPUBLISHABLE])
        elif state == Status.DEAD and (sealed := bridge.unopenable(args, kwargs, codec)):
            unpublishable[task_id] = f"{sealed}; resubmit it where that key is held"

    def why(i: str) -> str:
        if i not in status:
            return "not in the dead-letter queue"
        if status[i] != Status.DEAD:
            return f"status is {status[i]}"
        if i in unpublishable:
            return f"cannot be published again: {unpublishable[i]}"
        return "taken by a concurrent request"

    return [{"task_id": i, "why": why(i)} for i in rest]


def _preview(action: str, selection: Selection) -> ActionResult:
    rows = list(candidates(selection, publishable_only=action == Action.RESUBMIT)
                [: selection.cap + 1])
    more = len(rows) > selection.cap
    rows = rows[: selection.cap]
    return ActionResult(action=action, dry_run=True, matched=len(rows), more=more,
                        acted=[], skipped=_skipped(selection, [r.task_id for r in rows]),
                        sample=rows[:SAMPLE_SIZE])


def _claim(selection: Selection, publishable: bool = False
           ) -> tuple[list[DeadLetterEntry], bool]:
    """Lock up to ``limit`` dead candidates; rows another transaction holds are skipped."""
    qs = candidates(selection, publishable)
    if connection.features.has_select_for_update_skip_locked:
        qs = qs.select_for_update(skip_locked=True, of=("self",))
    rows = list(qs[: selection.cap + 1])
    return rows[: selection.cap], len(rows) > selection.cap


def _audit(action: str, selection: Selection, *, user: Any, source: str, matched: int,
           acted: list[str], reset_retry_count: bool | None = None, version: str = "",
           versions: dict[str, int] | None = None) -> DeadLetterAudit:
    real_user = user if getattr(user, "is_authenticated", False) else None
    return DeadLetterAudit.objects.create(
        user=real_user, username=real_user.get_username() if real_user else "",
        source=source, action=action,
        task_ids=list(selection.task_ids) if selection.task_ids is not None else None,
        filters=selection.describe() if selection.task_ids is None else None,
        reset_retry_count=reset_retry_count, version=version, versions=versions,
        limit=selection.limit if selection.task_ids is None else None,
        matched=matched, acted=len(acted), acted_ids=acted,
    )


def leave_dead(rows: Sequence[DeadLetterEntry]) -> None:
    """Keep the groups' ``dead`` counters true when entries stop being dead."""
    per_group: dict[str, int] = {}
    for row in rows:
        per_group[row.fingerprint] = per_group.get(row.fingerprint, 0) + 1
    if not per_group:
        return
    # one statement for every group touched (a thousand entries may span hundreds)
    FailureGroup.objects.filter(fingerprint__in=list(per_group)).update(
        dead=F("dead") - Case(*(When(fingerprint=fp, then=Value(n))
                                for fp, n in per_group.items()),
                              default=Value(0), output_field=IntegerField()))


def mark_resubmitted(rows: Sequence[DeadLetterEntry], now: datetime) -> None:
    """Claimed ``rows`` are ``resubmitted``, their publish pending (after the commit)."""
    DeadLetterEntry.objects.filter(pk__in=[r.pk for r in rows]).update(
        status=Status.RESUBMITTED, resubmit_count=F("resubmit_count") + 1,
        resubmitted_at=now, publish_pending=True)
    leave_dead(rows)


def resubmit(selection: Selection, *, reset_retry_count: bool = True,
             version: str = VersionChoice.ENTRY, user: Any = None, source: str = Source.CODE,
             dry_run: bool = False) -> ActionResult:
    """Resubmit the selected dead entries (each at most once, however many race).

    ``version``: ``entry`` (default) publishes each as the version recorded with its
    failure; ``current`` as the version its task has in this process's Celery app (raises
    :class:`SelectionError` if a task is not registered here). The audit records the choice
    and, with ``current``, the version of each task name. Entries that cannot be published
    again (``DeadLetter.unpublishable``) are never taken, and reported as skipped."""
    choice = version_choice(version, got=True)
    versions = current_versions(selection) if choice is ResubmitVersion.CURRENT else None
    if dry_run:
        return _preview(Action.RESUBMIT, selection)
    publish_pending()
    result = ActionResult(action=Action.RESUBMIT, dry_run=False)
    with transaction.atomic():
        rows, result.more = _claim(selection, publishable=True)
        # sealed with a key held here but altered: not claimed either (skipped, with why)
        codec = bridge.payload_codec()
        rows = [r for r in rows if bridge.unopenable(r.args, r.kwargs, codec) is None]
        ids = [r.task_id for r in rows]
        mark_resubmitted(rows, timezone.now())
        if versions is not None:  # the names actually claimed
            versions = {r.task_name: versions[r.task_name] for r in rows
                        if r.task_name in versions}
        audit = _audit(Action.RESUBMIT, selection, user=user, source=source,
                       matched=len(rows), acted=ids, reset_retry_count=reset_retry_count,
                       version=choice.value, versions=versions)
        result.matched, result.acted, result.audit_id = len(rows), ids, audit.pk
        result.sample = rows[:SAMPLE_SIZE]
        pks = [r.pk for r in rows]

        def after_commit() -> None:
            try:
                result.published = publish(pks, reset_retry_count, choice)
            except Exception:
                # Committed as resubmitted, not published (Redis or the broker is down):
                # the rows stay publish_pending for publish_pending() to finish.
                log.exception("publishing %d resubmitted dead letters failed; they stay "
                              "pending for publish_pending()", len(pks))
                result.published = []

        if rows:
            transaction.on_commit(after_commit)
        else:
            result.published = []
    result.skipped = _skipped(selection, ids)
    return result


def publish(pks: Sequence[int], reset_retry_count: bool,
            version: str = VersionChoice.ENTRY, *,
            refused: Callable[[list[int]], None] | None = None) -> list[str]:
    """Publish entries marked resubmitted (after their transaction committed): the claimed
    entries go out, the ones jobbers refused (their tasks are already running, pending or
    finished) are settled by ``refused`` (their pks). Returns the task ids published."""
    rows = {r.pk: r for r in DeadLetterEntry.objects.filter(
        pk__in=pks, status=Status.RESUBMITTED, publish_pending=True)}
    if not rows:
        return []

    def settle(left: list[int]) -> None:
        ids = sorted(rows[pk].task_id for pk in left)
        log.warning("%d resubmitted entries were not published: their tasks are already "
                    "running, pending or finished in jobbers: %s", len(ids),
                    ", ".join(ids[:20]))
        if refused is not None:
            refused(left)

    went = publish_claimed({pk: bridge.to_dead_letter(r) for pk, r in rows.items()},
                           bridge.get_jobbers().resubmit_dead_letters,
                           reset_retry_count=reset_retry_count, version=version,
                           refused=settle)
    # Published, or refused by the task's own state (nothing more to do for them). If a
    # publish failed after its step, the task holds a publish lease: the scheduler
    # publishes it when the lease expires.
    DeadLetterEntry.objects.filter(pk__in=list(rows)).update(publish_pending=False)
    return [rows[pk].task_id for pk in went]


def publish_pending(older_than: timedelta = timedelta(seconds=30)) -> int:
    """Publish entries marked resubmitted whose publish never ran (the process died between
    the commit and the publish, or Redis was down); returns how many were published.

    Runs at the start of every resubmit, and from ``manage.py jobbers_publish_pending``
    (run it from cron or a beat schedule so that nothing waits for the next resubmit)."""
    cutoff = timezone.now() - older_than
    pending = list(DeadLetterEntry.objects.filter(publish_pending=True,
                                                  resubmitted_at__lt=cutoff)
                   .values_list("pk", flat=True)[: conf.MAX_IDS])
    if not pending:
        return 0
    log.warning("publishing %d resubmitted dead letters left unpublished", len(pending))
    return len(publish(pending, reset_retry_count=True))


def discard(selection: Selection, *, user: Any = None, source: str = Source.CODE,
            dry_run: bool = False) -> ActionResult:
    """Mark the selected dead entries discarded (kept, and visible with status=discarded)."""
    if dry_run:
        return _preview(Action.DISCARD, selection)
    result = ActionResult(action=Action.DISCARD, dry_run=False, published=[])
    with transaction.atomic():
        rows, result.more = _claim(selection)
        ids = [r.task_id for r in rows]
        DeadLetterEntry.objects.filter(pk__in=[r.pk for r in rows]).update(
            status=Status.DISCARDED, discarded_at=timezone.now())
        leave_dead(rows)
        audit = _audit(Action.DISCARD, selection, user=user, source=source,
                       matched=len(rows), acted=ids)
        result.matched, result.acted, result.audit_id = len(rows), ids, audit.pk
        result.sample = rows[:SAMPLE_SIZE]
        held = [bridge.to_dead_letter(r) for r in rows]
        transaction.on_commit(lambda: release_chords(held))
    result.skipped = _skipped(selection, ids)
    return result


def release_chords(entries: Sequence[DeadLetter]) -> None:
    """Fail the chords whose parts the discarded entries held (once the discard committed):
    ``Jobbers.release_chord_parts``. A failure is logged: the discard stands, the chord's
    callback keeps waiting until its result backend expires it."""
    try:
        bridge.get_jobbers().release_chord_parts(entries)
    except Exception:
        log.exception("could not release the chord parts of %d discarded entries",
                      len(entries))


def resubmit_workflow(task_id: str, *, reset_retry_count: bool = True, user: Any = None,
                      source: str = Source.CODE) -> list[str]:
    """Send the failed members of the workflow ``task_id`` belongs to back to the broker
    (``Jobbers.resubmit_workflow``: each at most once, and a chord's callback runs once
    they complete); returns the members resubmitted.

    Their dead entries are then marked ``resubmitted`` (published already: nothing is left
    pending) and the action is audited (one resubmit naming the id asked for, the members
    in ``acted_ids``), so the queue and the audit say what happened, as for an entry
    resubmitted from the queue."""
    done = bridge.get_jobbers().resubmit_workflow(task_id, reset_retry_count=reset_retry_count)
    if not done:
        return done
    with transaction.atomic():
        qs = DeadLetterEntry.objects.filter(task_id__in=done, status=Status.DEAD)
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        rows = list(qs)
        DeadLetterEntry.objects.filter(pk__in=[r.pk for r in rows]).update(
            status=Status.RESUBMITTED, resubmit_count=F("resubmit_count") + 1,
            resubmitted_at=timezone.now(), publish_pending=False)
        leave_dead(rows)
        real_user = user if getattr(user, "is_authenticated", False) else None
        DeadLetterAudit.objects.create(
            user=real_user, username=real_user.get_username() if real_user else "",
            source=source, action=Action.RESUBMIT, task_ids=[task_id],
            reset_retry_count=reset_retry_count, version=VersionChoice.ENTRY,
            matched=len(done), acted=len(done), acted_ids=done, detail="workflow")
    return done
