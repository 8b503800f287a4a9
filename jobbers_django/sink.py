"""The Django ORM dead-letter sink: ``jobbers_dead_letter_sink =
"jobbers_django.sink.DjangoDeadLetterSink"`` in the Celery configuration.

Writing is idempotent per ``(task_id, attempt)`` also under concurrent writers: the entry
row is locked first (created if needed), then the failure row is inserted only if that
attempt is not there yet, and the entry's counters move only when it was inserted.

What is written is the entry's storable form (``jobbers_celery.storable_form``): a value
PostgreSQL refuses (``NaN``, NUL, a lone surrogate, an id over 255 characters, a count
over 32 bits, nesting past the bound) is stored visibly altered. An error the database
still raises about the row itself (``DataError``, ``IntegrityError``) is raised as
``jobbers_celery.DeadLetterRefused``: the dispatcher sets that entry aside and writes the
ones behind it, where an outage (``OperationalError``) keeps them all waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import (
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    transaction,
)
from django.db.models import F
from django.db.models.functions import Greatest, Least

from jobbers_celery import DeadLetterRefused, escaped_logger, storable_form
from jobbers_django.alerting import failure_stored
from jobbers_django.fingerprint import fingerprint

if TYPE_CHECKING:
    from jobbers_celery import DeadLetter
    from jobbers_django.models import DeadLetterEntry

__all__ = ["DjangoDeadLetterSink", "write_entry"]

log = escaped_logger("jobbers.django.sink")
_T = TypeVar("_T")


class DjangoDeadLetterSink:
    """Writes :class:`~jobbers_celery.DeadLetter` entries as database rows.

    Built by ``jobbers_celery`` with the ``Jobbers`` instance; touches the ORM only when
    writing, so it can be built while Django apps are still loading.
    """

    def __init__(self, jobbers: Any = None) -> None:
        self.jobbers = jobbers

    def write(self, entry: DeadLetter) -> None:
        _refusing(lambda: self._with_fresh_connection(lambda: write_entry(entry, self._told)))

    def write_many(self, entries: Sequence[DeadLetter]) -> None:
        """One transaction per entry, not one for the batch: a batch holding a failure
        group's row while waiting for an entry that a resubmit has locked (the resubmit then
        waiting for that group) would be a deadlock."""
        def write_all() -> None:
            for entry in entries:
                write_entry(entry, self._told)
        _refusing(lambda: self._with_fresh_connection(write_all))

    def _told(self, entry: DeadLetter, fingerprint: str, new_group: int | None) -> None:
        """The alerts hear of each failure stored: counted per failure group, and a new
        group told (``jobbers_django.alerting``)."""
        alerts = getattr(self.jobbers, "alerts", None)
        if alerts is not None:
            failure_stored(alerts, entry, fingerprint, new_group)

    def entry(self, task_id: str, attempt: int) -> DeadLetter | None:
        """The task's entry if its last failure is ``attempt`` (the one whose payload its
        Redis record dropped), else ``None``: ``Jobbers.resubmit`` takes the payload there."""
        from jobbers_django.bridge import to_dead_letter
        from jobbers_django.models import DeadLetterEntry

        def read() -> DeadLetterEntry | None:
            return (DeadLetterEntry.objects.filter(task_id=task_id, attempt=attempt)
                    .defer("traceback").first())

        row = self._with_fresh_connection(read)
        return to_dead_letter(row) if row is not None else None

    #: Every instance of a process counts the same table: the size gauge counts it once.
    size_scope = "jobbers_django.FailureGroup"

    def size(self) -> int:
        """Entries still dead (for the DLQ size gauge): a sum over the groups, cheap."""
        from django.db.models import Sum

        from jobbers_django.models import FailureGroup

        total = FailureGroup.objects.aggregate(n=Sum("dead"))["n"]
        return int(total or 0)

    @staticmethod
    def _with_fresh_connection(call: Callable[[], _T]) -> _T:
        # Worker processes live for days: a connection the server closed meanwhile fails
        # once; drop it and try again on a new one before the dispatcher parks the entry.
        try:
            return call()
        except (OperationalError, InterfaceError):
            if transaction.get_connection().in_atomic_block:
                raise
            log.warning("database connection lost; retrying the dead-letter query once")
            close_old_connections()
            transaction.get_connection().close()
            return call()


def _refusing(call: Callable[[], object]) -> None:
    """``call()``, the database refusing a row itself (``DataError``: a value out of range,
    ``IntegrityError``: a constraint) raised as ``DeadLetterRefused``: the entry's fault,
    not an outage."""
    try:
        call()
    except (DataError, IntegrityError) as exc:
        raise DeadLetterRefused(f"the database refused the entry: {exc}") from exc


def write_entry(entry: DeadLetter,
                told: Callable[[DeadLetter, str, int | None], None] | None = None) -> bool:
    """Store one failure (its storable form); ``False`` if this ``(task_id, attempt)`` was
    already stored. ``told``: called once it is stored (after the transaction), with the
    failure group's fingerprint and the group's id if this failure created it."""
    from jobbers_django.models import DeadLetterEntry, Status

    entry = storable_form(entry)
    # no exception (stalled, dropped): the reason stands in for its type
    fp = fingerprint(entry.name, entry.exception_type or f"({entry.reason})",
                     entry.exception_message, entry.traceback)
    last = _last_failure_fields(entry, fp.value)
    with transaction.atomic():
        row = DeadLetterEntry.objects.select_for_update().filter(task_id=entry.task_id).first()
        created = False
        if row is None:
            try:
                with transaction.atomic():
                    row = DeadLetterEntry.objects.create(
                        task_id=entry.task_id, first_failed_at=entry.failed_at,
                        failure_count=0, status=Status.DEAD, **last)
                created = True
            except IntegrityError:  # a concurrent writer created it: wait for its lock
                row = DeadLetterEntry.objects.select_for_update().get(task_id=entry.task_id)
        if not _insert_failure(row, entry, fp.value):
            return False
        newest = created or entry.failed_at >= row.last_failed_at
        was_dead_fp = None if created else (row.fingerprint if row.status == Status.DEAD
                                            else None)
        update: dict[str, Any] = {
            "failure_count": F("failure_count") + 1,
            "first_failed_at": Least(F("first_failed_at"), entry.failed_at),
        }
        if newest and not created:
            update.update(last, status=Status.DEAD, publish_pending=False)
        DeadLetterEntry.objects.filter(pk=row.pk).update(**update)
        new_group = _count_in_group(entry, fp,
                                    dead_delta=1 if newest and was_dead_fp != fp.value else 0)
        if newest and was_dead_fp is not None and was_dead_fp != fp.value:
            _move_dead(was_dead_fp, -1)
    if told is not None:
        told(entry, fp.value, new_group)
    return True


def _last_failure_fields(entry: DeadLetter, fp: str) -> dict[str, Any]:
    return {
        "task_name": entry.name,
        "task_version": entry.version,
        "queue": entry.queue or "",
        "args": entry.args,
        "kwargs": entry.kwargs,
        "options": entry.options,
        "checkpoint": entry.checkpoint,
        "reason": entry.reason,
        "exception_type": entry.exception_type or "",
        "exception_message": entry.exception_message or "",
        "traceback": entry.traceback or "",
        "last_failed_at": entry.failed_at,
        "worker": entry.worker or "",
        "attempt": entry.attempt,
        "retry_attempt": entry.retry_attempt,
        "fingerprint": fp,
    }


def _insert_failure(row: DeadLetterEntry, entry: DeadLetter, fp: str) -> bool:
    from jobbers_django.models import DeadLetterFailure

    if DeadLetterFailure.objects.filter(task_id=entry.task_id, attempt=entry.attempt).exists():
        return False
    try:
        with transaction.atomic():
            DeadLetterFailure.objects.create(
                entry=row, task_id=entry.task_id, attempt=entry.attempt,
                retry_attempt=entry.retry_attempt, reason=entry.reason,
                exception_type=entry.exception_type or "",
                exception_message=entry.exception_message or "",
                traceback=entry.traceback or "", worker=entry.worker or "",
                failed_at=entry.failed_at, fingerprint=fp,
            )
    except IntegrityError:  # the entry lock makes this unreachable; the constraint stays
        return False
    return True


def _count_in_group(entry: DeadLetter, fp: Any, dead_delta: int) -> int | None:
    """Count the failure in its group; the group's id if this created it."""
    from jobbers_django.models import FailureGroup

    update = {
        "failures": F("failures") + 1,
        "dead": F("dead") + dead_delta,
        "first_seen": Least(F("first_seen"), entry.failed_at),
        "last_seen": Greatest(F("last_seen"), entry.failed_at),
    }
    if FailureGroup.objects.filter(fingerprint=fp.value).update(**update):
        return None
    try:
        with transaction.atomic():
            group = FailureGroup.objects.create(
                fingerprint=fp.value, task_name=entry.name,
                exception_type=entry.exception_type or "", message=fp.message,
                frame=fp.frame[:500], failures=1, dead=dead_delta,
                first_seen=entry.failed_at, last_seen=entry.failed_at)
    except IntegrityError:  # created concurrently
        FailureGroup.objects.filter(fingerprint=fp.value).update(**update)
        return None
    return int(group.pk)


def _move_dead(fingerprint_value: str, delta: int) -> None:
    from jobbers_django.models import FailureGroup

    FailureGroup.objects.filter(fingerprint=fingerprint_value).update(dead=F("dead") + delta)
