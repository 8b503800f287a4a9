"""The Celery side of jobbers_django: the Celery app and its ``Jobbers``, the payload codec,
the ``DeadLetter`` a row stands for, and the live tasks (cancel, detail, overview).

Everything reaching Redis goes through ``jobbers_celery``'s public ``Jobbers`` methods, which
raise :class:`jobbers_celery.StoreUnavailable` when Redis cannot serve them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Q, QuerySet

from jobbers_celery import DeadLetter, PayloadCodec, TaskState, WorkflowState, unique_json
from jobbers_django import conf
from jobbers_django.models import (
    Action,
    DeadLetterAudit,
    DeadLetterEntry,
    DeadLetterFailure,
    Source,
)

if TYPE_CHECKING:
    from celery import Celery

    from jobbers_celery import (
        CleanerStatus,
        CountSample,
        FairHeld,
        Jobbers,
        SeriesRead,
        TaskRecord,
        Transition,
        Workflow,
    )

__all__ = [
    "WORKFLOW_LIMIT",
    "LiveOverview",
    "TaskDetail",
    "WorkflowDetail",
    "cancel_task",
    "cancel_workflow",
    "failure_history",
    "get_app",
    "get_jobbers",
    "live_overview",
    "openable",
    "payload_codec",
    "readable_arguments",
    "series",
    "series_names",
    "task_detail",
    "to_dead_letter",
    "unopenable",
    "workflow_detail",
]


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
    try:
        return PayloadCodec.of(get_jobbers().config.payload_keys)
    except Exception:  # noqa: BLE001 - no app installed here
        return None


def readable_arguments(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """An entry's arguments for display (redact them after): opened where this process
    holds the payload key that sealed them, else ``[ENCRYPTED]`` and ``{}``."""
    from jobbers_celery import readable_arguments as readable

    return readable(args, kwargs, payload_codec())


def unopenable(args: Any, kwargs: Any, codec: PayloadCodec | None) -> str | None:
    """Why this process cannot publish these sealed arguments (``None``: it can)."""
    from jobbers_celery import unopenable as why

    return why(args, kwargs, codec)


def openable(qs: QuerySet[DeadLetterEntry]) -> QuerySet[DeadLetterEntry]:
    """``qs`` without the entries whose arguments are sealed with a payload key this
    process does not hold: a process holding it resubmits them, never this one with the
    sealed form as arguments (see ``docs/howto/encryption.md``)."""
    codec = payload_codec()
    held = list(codec.kids) if codec is not None else []
    return qs.exclude(Q(kwargs__has_key=PayloadCodec.MARKER) & ~Q(kwargs__kid__in=held))


def to_dead_letter(row: DeadLetterEntry) -> DeadLetter:
    """The ``jobbers_celery`` entry a row stands for (its last failure)."""
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
    #: a unique task's lock: key digest, until, holder (``jobbers_celery.unique_json``)
    unique: dict[str, Any] | None = None


def task_detail(task_id: str) -> TaskDetail:
    jobbers = get_jobbers()
    return TaskDetail(task_id=task_id, record=jobbers.get(task_id),
                      transitions=jobbers.history(task_id),
                      entry=DeadLetterEntry.objects.filter(task_id=task_id).first(),
                      unique=unique_json(jobbers.unique_of(task_id), task_id))


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
    #: what fair shares hold back, per task name and key (``Jobbers.fair_held``)
    fair: list[FairHeld] = field(default_factory=list)


def live_overview(limit: int = 100, history_minutes: int = 60) -> LiveOverview:
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
        fair=jobbers.fair_held(limit),
    )


# ---------------------------------------------------------------------- history
def series(*, name: str | None = None, queue: str | None = None,
           since: datetime | None = None, until: datetime | None = None,
           span: timedelta | None = None, step: int | None = None) -> SeriesRead:
    """The per-minute history of ``name``, ``queue`` or every task (``Jobbers.series``):
    ``span`` back from now on the Redis clock, or ``[since, until)``. Raises
    ``SeriesRangeError`` for a range it refuses."""
    jobbers = get_jobbers()
    if span is not None:
        until = jobbers.now()
        since = until - span
    return jobbers.series(name=name, queue=queue, since=since, until=until, step=step)


def series_names(days: float) -> tuple[list[str], list[str]]:
    """The task names and queues the history holds for the last ``days``."""
    return get_jobbers().series_names(days)


# ---------------------------------------------------------------------- workflows
#: The most members a workflow page or answer reads (``Jobbers.workflow``'s ``limit``): a
#: bigger canvas is shown truncated, its counts still whole.
WORKFLOW_LIMIT = 1000


@dataclass(frozen=True)
class WorkflowDetail:
    """A canvas as one unit (:meth:`jobbers_celery.Jobbers.workflow`), asked for by
    ``task_id`` (any member's, the root's or a group's id), read at ``now`` (the Redis
    clock, which every task time comes from: a running member's elapsed time)."""

    task_id: str
    workflow: Workflow
    now: datetime

    def elapsed(self, record: TaskRecord) -> timedelta | None:
        """How long a member has run: from its first start to its end (to ``now`` while
        it has not ended); ``None`` before it started."""
        if record.started_at is None:
            return None
        return (record.completed_at or self.now) - record.started_at


def workflow_detail(task_id: str, limit: int = WORKFLOW_LIMIT) -> WorkflowDetail | None:
    """The workflow ``task_id`` belongs to, ``None`` when jobbers knows none."""
    jobbers = get_jobbers()
    found = jobbers.workflow(task_id, limit=limit)
    if found is None:
        return None
    return WorkflowDetail(task_id=task_id, workflow=found, now=jobbers.now())


def cancel_workflow(task_id: str, *, terminate: bool = False, user: Any = None,
                    source: str = Source.CODE) -> list[str]:
    """Cancel every member of the workflow ``task_id`` belongs to that has not finished
    (see ``Jobbers.cancel_workflow``); audited (one cancel naming the id asked for, the
    members in ``acted_ids``) when it took effect. Returns the members cancelled. A
    workflow that has ended (or is unknown) is left as it is: nothing is cancelled, and
    its state stays what it was."""
    jobbers = get_jobbers()
    found = jobbers.workflow(task_id, limit=WORKFLOW_LIMIT)  # its state needs its members
    if found is None or found.state is not WorkflowState.RUNNING:
        return []
    done = jobbers.cancel_workflow(task_id, terminate=terminate)
    if done:
        real_user = user if getattr(user, "is_authenticated", False) else None
        DeadLetterAudit.objects.create(
            user=real_user, username=real_user.get_username() if real_user else "",
            source=source, action=Action.CANCEL, task_ids=[task_id], matched=len(done),
            acted=len(done), acted_ids=done, detail="workflow")
    return done


def failure_history(task_id: str) -> QuerySet[DeadLetterFailure]:
    return DeadLetterFailure.objects.filter(task_id=task_id).order_by("failed_at", "attempt")
