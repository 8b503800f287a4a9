"""Dead-letter sinks: where failed, stalled and dropped tasks are written.

A sink is anything with ``write(entry)``; ``jobbers_dead_letter_sink`` names a factory that
receives the ``Jobbers`` instance. Writing must be idempotent per ``(task_id, attempt)``.
A sink may also have ``write_many(entries)`` (optional, see :class:`BatchDeadLetterSink`),
which the cleaner uses to write all the dead letters of a pass at once, and ``size()``
(optional, see :class:`SizedDeadLetterSink`), which the ``dead_letter_queue_size`` metric
gauge reports, and ``entry(task_id, attempt)`` (optional, see :class:`PayloadDeadLetterSink`):
a sink that can hand an entry back keeps the one stored copy of a dead task's payload, and
the task's record drops its own.
The dispatcher in front of it (:mod:`jobbers_celery.deadletter.dispatcher`) makes sure an
entry is not lost; the default sink is :mod:`jobbers_celery.deadletter.redis_sink`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from jobbers_celery.core.records import DeadLetter

if TYPE_CHECKING:
    from jobbers_celery.store import DeadLetterStore

__all__ = [
    "BatchDeadLetterSink",
    "DeadLetterSink",
    "PayloadDeadLetterSink",
    "SinkContext",
    "SizedDeadLetterSink",
]


@runtime_checkable
class DeadLetterSink(Protocol):
    """What every sink has. ``write`` is the only required method."""

    def write(self, entry: DeadLetter) -> None:
        """Store ``entry``; writing the same ``(task_id, attempt)`` twice keeps one entry."""


class BatchDeadLetterSink(DeadLetterSink, Protocol):
    """A sink that can also write many entries at once (found with ``getattr``, so sinks
    with ``write`` only keep working).

    ``write_many`` has the same idempotence as ``write``. It need not be atomic: when it
    raises, the dispatcher writes each entry again with ``write``, so a partly written batch
    is completed, not duplicated.
    """

    def write_many(self, entries: Sequence[DeadLetter]) -> None:
        """Store every entry of ``entries``."""


class SizedDeadLetterSink(DeadLetterSink, Protocol):
    """A sink that can tell how many entries it holds (found with ``getattr``; without it
    the ``dead_letter_queue_size`` gauge is not reported).

    Called only by the one process that reports the cluster-wide gauges, once per metric
    collection: it should be one cheap query. A process with several installed instances
    adds their sinks' sizes up; sinks of one queue (one database table) say so with an
    equal ``size_scope`` attribute (any hashable), and count once.
    """

    def size(self) -> int:
        """How many entries the dead-letter queue holds now."""


class PayloadDeadLetterSink(DeadLetterSink, Protocol):
    """A sink that can hand an entry back (found with ``getattr``).

    Its entries then hold the one stored copy of a dead task's payload (args, kwargs, publish
    options): once an entry is written, the task's Redis record drops its own copy, and
    ``Jobbers.resubmit`` takes the payload from the entry. A sink without ``entry`` leaves
    the record's copy in place (two copies until the record expires).
    """

    def entry(self, task_id: str, attempt: int) -> DeadLetter | None:
        """The entry written for ``(task_id, attempt)``, or ``None`` if there is none."""


class SinkContext(Protocol):
    """What a sink factory receives: the ``Jobbers`` instance (its ``store``, ``config``,
    ``app``); typed by what the default sink reads, so that this module stays below it."""

    @property
    def store(self) -> DeadLetterStore: ...

