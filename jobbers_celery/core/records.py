"""What reads return: task records, transitions and dead-letter entries. Pure dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from jobbers_celery.core.states import TaskState

__all__ = ["ALTERED", "UNPUBLISHABLE", "DeadLetter", "ErrorInfo", "SetAside", "SetAsideReport",
           "TaskRecord", "Transition", "from_ms"]

#: Key of ``DeadLetter.options`` saying why the entry cannot be published again (its
#: arguments were never recorded as JSON): kept in ``options`` so that every sink stores it.
UNPUBLISHABLE = "jobbers_unpublishable"
#: Key of ``DeadLetter.options`` listing the fields stored altered (``fields``) and the whole
#: values of the ones cut to fit (``full``): see :mod:`jobbers_celery.core.storable`.
ALTERED = "jobbers_altered"


def from_ms(value: float | str | None) -> datetime | None:
    """Redis-clock milliseconds to an aware UTC datetime (``None`` stays ``None``)."""
    if value is None or value == "":
        return None
    return datetime.fromtimestamp(int(value) / 1000.0, tz=UTC)


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """The last failure of a task: exception type (qualified name) and message."""

    type: str
    message: str


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task's current state. Datetimes are timezone-aware UTC, from the Redis clock."""

    task_id: str
    name: str
    version: int | None
    queue: str | None
    state: TaskState
    attempt: int
    retry_attempt: int
    submitted_at: datetime | None
    started_at: datetime | None
    retried_at: datetime | None
    completed_at: datetime | None
    heartbeat_at: datetime | None
    run_at: datetime | None
    worker: str | None
    error: ErrorInfo | None
    progress: Any
    checkpoint: Any
    #: Celery's ``root_id``, ``parent_id`` and ``group`` of a canvas member (``None`` for a
    #: task published alone): see :mod:`jobbers_celery.core.workflow`.
    root_id: str | None = None
    parent_id: str | None = None
    group_id: str | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """One entry of a task's history."""

    task_id: str
    from_state: TaskState
    to_state: TaskState
    at: datetime
    attempt: int
    worker: str | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker incarnation (one ``celery worker`` process; a restart is a new one):
    its hostname and pid, when its main process last said it was alive (Redis clock), and
    how many tasks it runs now."""

    incarnation: str
    hostname: str
    pid: int | None
    last_seen_at: datetime
    running: int

    @classmethod
    def parse(cls, incarnation: str, last_seen_ms: int, running: int) -> WorkerInfo:
        """From the store's ``hostname:pid:suffix`` incarnation id."""
        host, _, rest = incarnation.rpartition(":")[0].rpartition(":")
        pid = rest if host else ""
        return cls(incarnation, host or incarnation, int(pid) if pid.isdigit() else None,
                   datetime.fromtimestamp(last_seen_ms / 1000.0, tz=UTC), running)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """What a dead-letter sink receives. ``(task_id, attempt)`` identifies it.

    ``options`` holds what is needed to publish the task again (queue, routing, headers,
    callbacks), so an entry can be resubmitted after its Redis record has expired; or, under
    :data:`UNPUBLISHABLE`, why it cannot be (see :attr:`unpublishable`).
    """

    task_id: str
    name: str
    version: int | None
    queue: str | None
    reason: str
    args: list[Any]
    kwargs: dict[str, Any]
    exception_type: str | None
    exception_message: str | None
    traceback: str | None
    attempt: int
    retry_attempt: int
    worker: str | None
    failed_at: datetime
    checkpoint: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def unpublishable(self) -> str | None:
        """Why this entry cannot be published again (its arguments were never recorded as
        JSON: not JSON-serializable, or a message the worker refused before reading it),
        ``None`` if it can. Resubmitting it is refused rather than sending a task without
        its arguments."""
        why = self.options.get(UNPUBLISHABLE)
        return str(why) if why else None

    @property
    def altered(self) -> tuple[str, ...]:
        """The fields stored in a visibly altered form because no sink could store them as
        they were (see :mod:`jobbers_celery.core.storable`); empty for an entry stored as is."""
        info = self.options.get(ALTERED) if isinstance(self.options, dict) else None
        fields = info.get("fields") if isinstance(info, dict) else None
        return tuple(str(f) for f in fields) if isinstance(fields, list) else ()

    @property
    def recorded_task_id(self) -> str:
        """The id the task's record is kept under: the whole id when the stored one was cut
        to fit (kept in ``options[ALTERED]["full"]``), else :attr:`task_id`."""
        info = self.options.get(ALTERED) if isinstance(self.options, dict) else None
        full = info.get("full") if isinstance(info, dict) else None
        whole = full.get("task_id") if isinstance(full, dict) else None
        return whole if isinstance(whole, str) else self.task_id

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``failed_at`` as ISO 8601)."""
        return {
            "task_id": self.task_id,
            "name": self.name,
            "version": self.version,
            "queue": self.queue,
            "reason": self.reason,
            "args": self.args,
            "kwargs": self.kwargs,
            "exception_type": self.exception_type,
            "exception_message": self.exception_message,
            "traceback": self.traceback,
            "attempt": self.attempt,
            "retry_attempt": self.retry_attempt,
            "worker": self.worker,
            "failed_at": self.failed_at.isoformat(),
            "checkpoint": self.checkpoint,
            "options": self.options,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeadLetter:
        values = dict(data)
        values["failed_at"] = datetime.fromisoformat(values["failed_at"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SetAside:
    """A dead letter the sink refused for a reason of its own (even in its storable form),
    or an unreadable parked entry: kept aside, never retried, so the entries behind it are
    written. ``entry`` is the entry's JSON as it was parked (``None`` when it had none);
    the other fields are for people (escaped, cut) and never hold its arguments."""

    at: datetime
    why: str
    source: str
    task_id: str | None
    name: str | None
    attempt: int | None
    reason: str | None
    entry: str | None

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "why": self.why, "source": self.source,
                "task_id": self.task_id, "name": self.name, "attempt": self.attempt,
                "reason": self.reason, "entry": self.entry}


@dataclass(frozen=True, slots=True)
class SetAsideReport:
    """The newest set-aside dead letters, how many are kept, and how many were set aside
    since the dataset began (the older ones past the bound dropped from the list, logged)."""

    kept: int
    total: int
    entries: list[SetAside]
