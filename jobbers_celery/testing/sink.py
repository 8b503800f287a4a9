"""InMemoryDeadLetterSink: a dead-letter sink that keeps its entries in a list.

Why: a test asserts on what reached the dead-letter queue (which task, which attempt, why,
with what arguments) by reading ``sink.entries``, with no Redis and no database. It keeps
the sink contract (idempotent per ``(task_id, attempt)``), so a test sees what a real sink
would hold after a retried write.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from jobbers_celery.core.records import DeadLetter

__all__ = ["InMemoryDeadLetterSink"]


class InMemoryDeadLetterSink:
    """Entries in memory, oldest first. ``jobbers_dead_letter_sink`` may name it: the
    factory argument (the ``Jobbers`` instance) is accepted and ignored."""

    def __init__(self, context: object = None) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int], DeadLetter] = {}

    def write(self, entry: DeadLetter) -> None:
        """Keep ``entry``; the same ``(task_id, attempt)`` written again keeps the first."""
        with self._lock:
            self._entries.setdefault((entry.task_id, entry.attempt), entry)

    def write_many(self, entries: Sequence[DeadLetter]) -> None:
        for entry in entries:
            self.write(entry)

    def size(self) -> int:
        with self._lock:
            return len(self._entries)

    def entry(self, task_id: str, attempt: int) -> DeadLetter | None:
        with self._lock:
            return self._entries.get((task_id, attempt))

    @property
    def entries(self) -> list[DeadLetter]:
        """Every entry written, oldest first (a copy: safe to hold while tasks run)."""
        with self._lock:
            return list(self._entries.values())

    def of(self, task_id: str) -> list[DeadLetter]:
        """The entries of one task, one per attempt that ended dead."""
        return [e for e in self.entries if e.task_id == task_id]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
