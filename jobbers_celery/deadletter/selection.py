"""What a dead-letter command line takes, and how it says no: the one model behind
``celery jobbers dlq`` (the Redis sink) and ``manage.py jobbers_dlq`` (the Django sink).

Both commands read the same input the same way here, before anything is read from a store:
an id (any string Celery runs, bounded, text), the three filters (``--queue``, ``--task``,
``--version``), the rule that no ids and no filter is a usage error, never "everything",
and the paced options. They exit with the same codes (:class:`DlqExit`) and show a paced
resubmit's progress in the same columns (:class:`DlqRunView`). Each command turns a
:class:`DlqUsageError` into its framework's usage error (click's, Django's ``CommandError``).

What differs is what each sink keeps: the Redis sink keeps an entry per dead attempt, so its
ids may name one (``TASK_ID:ATTEMPT``, :class:`DlqId`); the Django sink keeps one row per task.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from jobbers_celery.core.printable import printable
from jobbers_celery.core.records import DeadLetter

__all__ = [
    "TASK_ID_MAX",
    "DlqExit",
    "DlqFilters",
    "DlqId",
    "DlqIdError",
    "DlqRunView",
    "DlqUsageError",
    "RunProgress",
    "check_pace_options",
    "check_task_id",
    "dlq_criteria",
]

#: The longest task id a command looks up (the REST API's bound too,
#: ``jobbers_django.api.serializers.fields.TASK_ID_MAX_LENGTH``): any character is accepted,
#: as Celery accepts any string, but no one types an id of megabytes.
TASK_ID_MAX = 4096
_SURROGATE = re.compile("[\ud800-\udfff]")


class DlqExit(IntEnum):
    """The exit codes of both dead-letter command lines (and of ``celery jobbers``)."""

    OK = 0
    #: the store or the database unreachable, an action that did not apply
    RUNTIME = 1
    #: bad input, refused before anything is read
    USAGE = 2
    #: no such entry, task or run
    NOT_FOUND = 3


class DlqUsageError(ValueError):
    """Bad input (exit :attr:`DlqExit.USAGE`), found before anything is read. ``option``
    names the option at fault (``--limit``), ``None`` for an id or the criteria as a whole."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.option = option

    @classmethod
    def of_field(cls, field: str, message: str) -> DlqUsageError:
        """The error of a value's field (``halt_after`` of a pace), named as its option."""
        option = f"--{field.replace('_', '-')}"
        return cls(f"{option}: {message}", option)


class DlqIdError(DlqUsageError):
    """An id no store can hold (too long, not text): the command's ``ID`` argument."""


def check_task_id(value: str) -> str:
    """A task id as given, whatever its characters (Celery runs any string); one over
    :data:`TASK_ID_MAX` characters, or with a lone surrogate (a shell's byte that is not
    UTF-8: no store holds it), is refused."""
    if len(value) > TASK_ID_MAX:
        raise DlqIdError(f"task id of {len(value)} characters: at most {TASK_ID_MAX} "
                         "characters")
    if _SURROGATE.search(value):
        raise DlqIdError(f"task id {printable(value)} is not UTF-8: it names no task")
    return value


@dataclass(frozen=True, slots=True)
class DlqId:
    """``TASK_ID`` (its entries, newest attempt first) or ``TASK_ID:ATTEMPT`` (one entry)."""

    task_id: str
    attempt: int | None = None

    @classmethod
    def parse(cls, value: str, per_attempt: bool = True) -> DlqId:
        """``value`` checked (:func:`check_task_id`); with ``per_attempt`` (a sink that keeps
        an entry per attempt), a ``:N`` suffix names the attempt."""
        check_task_id(value)
        head, _, tail = value.rpartition(":")
        if per_attempt and head and tail.isdigit():
            return cls(head, int(tail))
        return cls(value)

    def __str__(self) -> str:
        return self.task_id if self.attempt is None else f"{self.task_id}:{self.attempt}"


@dataclass(frozen=True, slots=True)
class DlqFilters:
    """``--queue``, ``--task`` and ``--version``: an entry matches when it has every value
    given (exact)."""

    queue: str | None = None
    task: str | None = None
    version: int | None = None

    def __bool__(self) -> bool:
        return self.queue is not None or self.task is not None or self.version is not None

    def matches(self, entry: DeadLetter) -> bool:
        return ((self.queue is None or entry.queue == self.queue)
                and (self.task is None or entry.name == self.task)
                and (self.version is None or entry.version == self.version))

    def given(self) -> dict[str, str | int]:
        """The filters given, by name (``queue``, ``task``, ``version``): a run's record."""
        return {k: v for k, v in (("queue", self.queue), ("task", self.task),
                                  ("version", self.version)) if v is not None}


def dlq_criteria(ids: Sequence[str], filters: DlqFilters, *, per_attempt: bool
                 ) -> list[DlqId]:
    """What ``resubmit`` and ``discard`` act on, checked before anything is read: every id
    (:meth:`DlqId.parse`), and ids or at least one filter. ``per_attempt``: the ids are
    entry ids (``TASK_ID[:ATTEMPT]``), else task ids."""
    parsed = [DlqId.parse(given, per_attempt) for given in ids]
    if not parsed and not filters:
        noun = "entry" if per_attempt else "task"
        raise DlqUsageError(f"give {noun} ids or at least one filter (--queue, --task, "
                            "--version); no criteria never means everything")
    return parsed


def check_pace_options(rate: float | None, halt_after: int | None,
                       of_last: int | None) -> None:
    """The stop rule (``--halt-after``, ``--of-last``) without ``--rate`` is refused. The
    bounds are the pace's own (``ResubmitPace``; its error through
    :meth:`DlqUsageError.of_field`)."""
    if rate is None and (halt_after is not None or of_last is not None):
        raise DlqUsageError("--halt-after and --of-last need --rate")


class RunProgress(Protocol):
    """A paced resubmit as both sinks keep it (``ResubmitRunInfo``, the Django sink's
    ``ResubmitRun``)."""

    @property
    def id(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def rate(self) -> float: ...
    @property
    def rule(self) -> str: ...
    @property
    def total(self) -> int: ...
    @property
    def published(self) -> int: ...
    @property
    def completed(self) -> int: ...
    @property
    def failed_again(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def remaining(self) -> int: ...


@dataclass(frozen=True, slots=True)
class DlqRunView:
    """A paced resubmit as both command lines show it: a headline, then one row of
    :attr:`COLUMNS` (each command draws the table its way)."""

    COLUMNS = ("SELECTED", "PUBLISHED", "COMPLETED", "FAILED AGAIN", "SKIPPED", "REMAINING")

    run: RunProgress

    @property
    def started(self) -> str:
        """What ``resubmit --rate`` says once the run is started."""
        r = self.run
        return f"Started paced resubmit #{r.id}: {r.total} entries at {r.rate:g} per second; " \
               f"{r.rule}."

    @property
    def headline(self) -> str:
        r = self.run
        return f"Paced resubmit #{r.id}: {r.status}, {r.rate:g}/s, {r.rule}"

    @property
    def row(self) -> tuple[int, ...]:
        r = self.run
        return (r.total, r.published, r.completed, r.failed_again, r.skipped, r.remaining)
