"""What the admin and the API do, in one place: neither talks to Redis or changes the
dead-letter tables on its own (both list them with :mod:`jobbers_django.querysets`).

Everything reaching Redis goes through ``jobbers_celery``'s public ``Jobbers`` methods, which
raise :class:`jobbers_celery.StoreUnavailable` when Redis cannot serve them.

Resubmission: the entries are claimed in one transaction (``SELECT ... FOR UPDATE SKIP
LOCKED`` where the status is still ``dead``), marked ``resubmitted`` and audited; the
messages are published only after that transaction commits. So two requests racing for
the same entries resubmit each at most once, and a rolled-back request publishes nothing.
``jobbers_celery`` then moves each task ``failed -> submitted`` with a compare-and-set step,
a second guard against a double publish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.db.models import Case, F, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone

from jobbers_celery import escaped_logger
from jobbers_django import conf
from jobbers_django.models import (
    Action,
    DeadLetterAudit,
    DeadLetterEntry,
    FailureGroup,
    Source,
    Status,
    VersionChoice,
)
from jobbers_django.querysets import FILTERS, NEWEST_FIRST, filter_entries

if TYPE_CHECKING:
    from celery import Celery

    from jobbers_celery import (
        CleanerStatus,
        CountSample,
        DeadLetter,
        Jobbers,
        PayloadCodec,
        TaskRecord,
        Transition,
    )

__all__ = [
    "FILTERS",
    "ActionResult",
    "LiveOverview",
    "Selection",
    "SelectionError",
    "TaskDetail",
    "cancel_task",
    "discard",
    "filter_entries",
    "get_app",
    "get_jobbers",
    "live_overview",
    "payload_codec",
    "publish_pending",
    "readable_arguments",
    "resubmit",
    "task_detail",
    "to_dead_letter",
]

log = escaped_logger("jobbers.django")

SAMPLE_SIZE = 10


class SelectionError(ValueError):
    """A selection that must not run; ``field`` names the culprit."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


# ---------------------------------------------------------------------- Celery side
def get_app() -> Celery:
    """The Celery app of ``JOBBERS_CELERY_APP``, or Celery's current app."""
    path = conf.get("CELERY_APP")
    if path:
        from kombu.utils.imports import symbol_by_name

        app: Celery = symbol_by_name(path)
        return app
    from celery import current_app

    # current_app is a proxy; the jobbers instance hangs on the real app object
    real: Celery = current_app._get_current_object()  # type: ignore[attr-defined]
    return real


def get_jobbers() -> Jobbers:
    from jobbers_celery import get_jobbers as _get

    return _get(get_app())


def payload_codec() -> PayloadCodec | None:
    """The codec of the Celery app's ``jobbers_payload_keys``; ``None`` without an app here
    (sealed arguments are then shown as encrypted and not resubmitted from here)."""
    from jobbers_celery import PayloadCodec

    try:
        return PayloadCodec.of(get_jobbers().config.payload_keys)
    except Exception:  # noqa: BLE001 - no app installed here
        return None


def readable_arguments(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """An entry's arguments for display (redact them after): opened where this process
    holds the payload key that sealed them, else ``[ENCRYPTED]`` and ``{}``."""
    from jobbers_celery import readable_arguments as readable

    return readable(args, kwargs, payload_codec())


def _unopenable(args: Any, kwargs: Any, codec: PayloadCodec | None) -> str | None:
    from jobbers_celery import unopenable

    return unopenable(args, kwargs, codec)


def _openable(qs: QuerySet[DeadLetterEntry]) -> QuerySet[DeadLetterEntry]:
    """``qs`` without the entries whose arguments are sealed with a payload key this
    process does not hold: a process holding it resubmits them, never this one with the
    sealed form as arguments (see ``docs/howto/encryption.md``)."""
    from jobbers_celery import PayloadCodec

    codec = payload_codec()
    held = list(codec.kids) if codec is not None else []
    return qs.exclude(Q(kwargs__has_key=PayloadCodec.MARKER) & ~Q(kwargs__kid__in=held))


# ---------------------------------------------------------------------- selections
@dataclass(frozen=True)
class Selection:
    """Which dead letters an action is for: explicit ``task_ids`` or ``filters``, never
    neither (an empty selection does not mean "everything"). ``limit`` bounds what a filter
    takes; explicit ids are all taken (at most ``MAX_IDS``)."""

    task_ids: tuple[str, ...] | None = None
    filters: Mapping[str, Any] = field(default_factory=dict)
    limit: int = conf.DEFAULT_RESUBMIT_LIMIT

    def __post_init__(self) -> None:
        if self.task_ids is not None and self.filters:
            raise SelectionError("task_ids", "give task_ids or filters, not both")
        if self.task_ids is None and not self.filters:
            raise SelectionError("filters", "give task_ids or at least one filter; "
                                 "an empty selection never means everything")
        if self.task_ids is not None:
            if not self.task_ids:
                raise SelectionError("task_ids", "must not be empty")
            if len(self.task_ids) > conf.MAX_IDS:
                raise SelectionError("task_ids", f"at most {conf.MAX_IDS} ids per request, "
                                     f"got {len(self.task_ids)}")
        unknown = set(self.filters) - set(FILTERS)
        if unknown:
            raise SelectionError(min(unknown), "unknown filter")
        if not 1 <= self.limit <= conf.MAX_LIMIT:
            raise SelectionError("limit", f"must be between 1 and {conf.MAX_LIMIT}")

    @property
    def cap(self) -> int:
        """How many entries the action may take: every id given, or ``limit`` of a filter."""
        return len(self.task_ids) if self.task_ids is not None else self.limit

    def describe(self) -> dict[str, Any]:
        """JSON-ready, for the audit."""
        return {k: v.isoformat() if isinstance(v, datetime) else v
                for k, v in self.filters.items()}


def _unpublishable_key() -> str:
    from jobbers_celery import UNPUBLISHABLE

    return UNPUBLISHABLE


def _candidates(selection: Selection, publishable: bool = False
                ) -> QuerySet[DeadLetterEntry]:
    """The dead entries ``selection`` takes, newest first; ``publishable``: only those that
    can be published again (a resubmit leaves the others, see ``DeadLetter.unpublishable``)."""
    qs = DeadLetterEntry.objects.filter(status=Status.DEAD)
    if publishable:
        qs = _openable(qs.exclude(options__has_key=_unpublishable_key()))
    if selection.task_ids is not None:
        return qs.filter(task_id__in=selection.task_ids).order_by(*NEWEST_FIRST)
    filters = dict(selection.filters)
    filters.pop("status", None)  # actions only ever take dead entries
    return filter_entries(qs, filters).order_by(*NEWEST_FIRST)


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


def _skipped(selection: Selection, acted: Sequence[str]) -> list[dict[str, str]]:
    if selection.task_ids is None:
        return []
    rest = [i for i in dict.fromkeys(selection.task_ids) if i not in set(acted)]
    if not rest:
        return []
    key = _unpublishable_key()
    codec = payload_codec()
    status: dict[str, str] = {}
    unpublishable: dict[str, str] = {}
    for task_id, state, options, args, kwargs in (
            DeadLetterEntry.objects.filter(task_id__in=rest)
            .values_list("task_id", "status", "options", "args", "kwargs")):
        status[task_id] = state
        if state == Status.DEAD and isinstance(options, dict) and options.get(key):
            unpublishable[task_id] = str(options[key])
        elif state == Status.DEAD and (sealed := _unopenable(args, kwargs, codec)):
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
    rows = list(_candidates(selection, publishable=action == Action.RESUBMIT)
                [: selection.cap + 1])
    more = len(rows) > selection.cap
    rows = rows[: selection.cap]
    return ActionResult(action=action, dry_run=True, matched=len(rows), more=more,
                        acted=[], skipped=_skipped(selection, [r.task_id for r in rows]),
                        sample=rows[:SAMPLE_SIZE])


def _claim(selection: Selection, publishable: bool = False
           ) -> tuple[list[DeadLetterEntry], bool]:
    """Lock up to ``limit`` dead candidates; rows another transaction holds are skipped."""
    qs = _candidates(selection, publishable)
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


def _leave_dead(rows: Sequence[DeadLetterEntry]) -> None:
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


def _current_versions(selection: Selection) -> dict[str, int]:
    """The current version of every task the selection would resubmit (see
    ``Jobbers.current_versions``); ``SelectionError`` on ``version`` if one is not
    registered in this process's Celery app, before anything changes."""
    names = set(_candidates(selection, publishable=True)[: selection.cap]
                .values_list("task_name", flat=True))
    try:
        return get_jobbers().current_versions(names)
    except ValueError as exc:
        raise SelectionError("version", str(exc)) from None


def resubmit(selection: Selection, *, reset_retry_count: bool = True,
             version: str = VersionChoice.ENTRY, user: Any = None, source: str = Source.CODE,
             dry_run: bool = False) -> ActionResult:
    """Resubmit the selected dead entries (each at most once, however many race).

    ``version``: ``entry`` (default) publishes each as the version recorded with its
    failure; ``current`` as the version its task has in this process's Celery app (raises
    :class:`SelectionError` if a task is not registered here). The audit records the choice
    and, with ``current``, the version of each task name. Entries that cannot be published
    again (``DeadLetter.unpublishable``) are never taken, and reported as skipped."""
    from jobbers_celery import ResubmitVersion

    try:
        choice = ResubmitVersion(version)
    except ValueError:
        raise SelectionError("version", f"must be one of {', '.join(ResubmitVersion)}, got "
                             f"{version!r}") from None
    versions = _current_versions(selection) if choice is ResubmitVersion.CURRENT else None
    if dry_run:
        return _preview(Action.RESUBMIT, selection)
    publish_pending()
    result = ActionResult(action=Action.RESUBMIT, dry_run=False)
    with transaction.atomic():
        rows, result.more = _claim(selection, publishable=True)
        # sealed with a key held here but altered: not claimed either (skipped, with why)
        codec = payload_codec()
        rows = [r for r in rows if _unopenable(r.args, r.kwargs, codec) is None]
        ids = [r.task_id for r in rows]
        now = timezone.now()
        DeadLetterEntry.objects.filter(pk__in=[r.pk for r in rows]).update(
            status=Status.RESUBMITTED, resubmit_count=F("resubmit_count") + 1,
            resubmitted_at=now, publish_pending=True)
        _leave_dead(rows)
        if versions is not None:  # the names actually claimed
            versions = {r.task_name: versions[r.task_name] for r in rows
                        if r.task_name in versions}
        audit = _audit(Action.RESUBMIT, selection, user=user, source=source,
                       matched=len(rows), acted=ids, reset_retry_count=reset_retry_count,
                       version=choice.value, versions=versions)
        result.matched, result.acted, result.audit_id = len(rows), ids, audit.pk
        result.sample = rows[:SAMPLE_SIZE]
        pks = [r.pk for r in rows]

        def publish() -> None:
            try:
                result.published = _publish(pks, reset_retry_count, choice)
            except Exception:
                # Committed as resubmitted, not published (Redis or the broker is down):
                # the rows stay publish_pending for publish_pending() to finish.
                log.exception("publishing %d resubmitted dead letters failed; they stay "
                              "pending for publish_pending()", len(pks))
                result.published = []

        if rows:
            transaction.on_commit(publish)
        else:
            result.published = []
    result.skipped = _skipped(selection, ids)
    return result


def _publish(pks: Sequence[int], reset_retry_count: bool,
             version: str = VersionChoice.ENTRY) -> list[str]:
    """Publish entries marked resubmitted (after their transaction committed)."""
    rows = list(DeadLetterEntry.objects.filter(pk__in=pks, status=Status.RESUBMITTED,
                                               publish_pending=True))
    if not rows:
        return []
    published = get_jobbers().resubmit_dead_letters([to_dead_letter(r) for r in rows],
                                                   reset_retry_count=reset_retry_count,
                                                   version=version)
    refused = {r.task_id for r in rows} - set(published)
    if refused:
        log.warning("%d resubmitted entries were not published: their tasks are already "
                    "running, pending or finished in jobbers: %s", len(refused),
                    ", ".join(sorted(refused)[:20]))
    # Published, or refused by the task's own state (nothing more to do for them). If a
    # publish failed after its step, the task holds a publish lease: the scheduler
    # publishes it when the lease expires.
    DeadLetterEntry.objects.filter(pk__in=[r.pk for r in rows]).update(publish_pending=False)
    return published


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
    return len(_publish(pending, reset_retry_count=True))


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
        _leave_dead(rows)
        audit = _audit(Action.DISCARD, selection, user=user, source=source,
                       matched=len(rows), acted=ids)
        result.matched, result.acted, result.audit_id = len(rows), ids, audit.pk
        result.sample = rows[:SAMPLE_SIZE]
    result.skipped = _skipped(selection, ids)
    return result


def to_dead_letter(row: DeadLetterEntry) -> DeadLetter:
    """The ``jobbers_celery`` entry a row stands for (its last failure)."""
    from jobbers_celery import DeadLetter

    return DeadLetter(
        task_id=row.task_id, name=row.task_name, version=row.task_version,
        queue=row.queue or None, reason=row.reason, args=list(row.args or []),
        kwargs=dict(row.kwargs or {}), exception_type=row.exception_type or None,
        exception_message=row.exception_message or None, traceback=row.traceback or None,
        attempt=row.attempt, retry_attempt=row.retry_attempt, worker=row.worker or None,
        failed_at=row.last_failed_at, checkpoint=row.checkpoint, options=dict(row.options or {}),
    )


# ---------------------------------------------------------------------- live tasks
def cancel_task(task_id: str, *, terminate: bool = False, user: Any = None,
                source: str = Source.CODE) -> bool:
    """Cancel a task durably (see ``Jobbers.cancel``); audited when it took effect."""
    done = get_jobbers().cancel(task_id, terminate=terminate)
    if done:
        real_user = user if getattr(user, "is_authenticated", False) else None
        DeadLetterAudit.objects.create(
            user=real_user, username=real_user.get_username() if real_user else "",
            source=source, action=Action.CANCEL, task_ids=[task_id], matched=1, acted=1,
            acted_ids=[task_id])
    return done


@dataclass(frozen=True)
class TaskDetail:
    task_id: str
    record: TaskRecord | None
    transitions: list[Transition]
    entry: DeadLetterEntry | None


def task_detail(task_id: str) -> TaskDetail:
    jobbers = get_jobbers()
    return TaskDetail(task_id=task_id, record=jobbers.get(task_id),
                      transitions=jobbers.history(task_id),
                      entry=DeadLetterEntry.objects.filter(task_id=task_id).first())


@dataclass(frozen=True)
class LiveOverview:
    counts: dict[str, int]
    running: list[TaskRecord]
    stalled: list[TaskRecord]
    scheduled: list[TaskRecord]
    cleaner: CleanerStatus | None
    now: datetime
    #: tasks per state, one sample a minute, oldest first (``Jobbers.count_history``)
    history: list[CountSample] = field(default_factory=list)


def live_overview(limit: int = 100, history_minutes: int = 60) -> LiveOverview:
    from jobbers_celery import TaskState

    jobbers = get_jobbers()
    return LiveOverview(
        counts={state.value: n for state, n in jobbers.counts().items()},
        running=jobbers.tasks(state=TaskState.STARTED, limit=limit),
        stalled=jobbers.tasks(state=TaskState.STALLED, limit=limit),
        scheduled=jobbers.scheduled(limit=limit),
        cleaner=jobbers.cleaner_status(),
        # the task times are Redis times: elapsed is measured on the same clock
        now=jobbers.now(),
        history=jobbers.count_history(history_minutes),
    )


def failure_history(task_id: str) -> QuerySet[Any]:
    from jobbers_django.models import DeadLetterFailure

    return DeadLetterFailure.objects.filter(task_id=task_id).order_by("failed_at", "attempt")
