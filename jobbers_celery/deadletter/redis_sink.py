"""The default dead-letter sink: the entries in Redis, in the jobbers namespace.

It reads and writes the entries' JSON; the store's dead-letter part
(:mod:`jobbers_celery.store.deadletters`) runs the Redis commands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.storable import storable_form, storable_id
from jobbers_celery.deadletter.sink import SinkContext
from jobbers_celery.store.parts import DeadLetterStore

__all__ = ["SELECT_EXAMINED", "RedisDeadLetterSink"]

#: Entries :meth:`RedisDeadLetterSink.select` looks at, at most (newest first), and per read.
SELECT_EXAMINED = 100_000
_SELECT_PAGE = 500


class RedisDeadLetterSink:
    """The default sink: a hash of JSON entries plus a time index, in the jobbers namespace."""

    def __init__(self, jobbers: SinkContext) -> None:
        self.store: DeadLetterStore = jobbers.store

    def write(self, entry: DeadLetter) -> None:
        """Store the storable form of ``entry`` (:func:`~jobbers_celery.core.storable.storable`)."""
        self.store.put_entries([_row(entry)], atomic=True)

    def write_many(self, entries: Sequence[DeadLetter]) -> None:
        """One round trip for all ``entries``: the per-entry commands of ``write`` in one
        pipeline, without MULTI (each command is idempotent on its own, and a batch cut
        short is written again entry by entry)."""
        self.store.put_entries([_row(entry) for entry in entries], atomic=False)

    def size(self) -> int:
        """Entries stored (one ``HLEN``)."""
        return self.store.entry_count()

    def entry(self, task_id: str, attempt: int) -> DeadLetter | None:
        """The entry of ``(task_id, attempt)`` (one ``HGET``), ``None`` if absent; found by
        the task's own id whatever it holds (stored under
        :func:`~jobbers_celery.core.storable.storable_id`)."""
        raw = self.store.entry_text(f"{storable_id(task_id)}:{attempt}")
        return DeadLetter.from_json(json.loads(raw)) if raw else None

    def entries(self, limit: int = 100) -> list[DeadLetter]:
        """Newest first."""
        return [DeadLetter.from_json(json.loads(r)) for r in self.store.entry_texts(0, limit)
                if r]

    def select(self, queue: str | None = None, name: str | None = None,
               version: int | None = None, limit: int = 100) -> list[DeadLetter]:
        """The newest ``limit`` entries matching every given criterion. The sink has no
        index but time: it reads the entries newest first, in pages, and looks at no more
        than :data:`SELECT_EXAMINED` of them."""
        found: list[DeadLetter] = []
        offset = 0
        while len(found) < limit and offset < SELECT_EXAMINED:
            raw = self.store.entry_texts(offset, _SELECT_PAGE)
            if not raw:
                break
            offset += len(raw)
            for text in raw:
                if not text:
                    continue
                entry = DeadLetter.from_json(json.loads(text))
                if ((queue is None or entry.queue == queue)
                        and (name is None or entry.name == name)
                        and (version is None or entry.version == version)):
                    found.append(entry)
                    if len(found) == limit:
                        break
        return found

    def of_task(self, task_id: str) -> list[DeadLetter]:
        """Every entry of ``task_id`` (one per dead attempt), newest attempt first: one
        ``HSCAN`` of the entries (no index by task id; for an operator's look-up)."""
        task_id = storable_id(task_id)  # as the entries are stored
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", task_id) + ":*"
        found = [DeadLetter.from_json(json.loads(text)) for member, text
                 in self.store.entries_matching(pattern)
                 if member.rpartition(":")[0] == task_id]
        return sorted(found, key=lambda e: e.attempt, reverse=True)

    def discard(self, entries: Iterable[DeadLetter]) -> int:
        """Remove ``entries``; how many were there (a discarded entry is gone for good: its
        task can no longer be resubmitted from it)."""
        return self.store.remove_entries(
            list(dict.fromkeys(f"{e.task_id}:{e.attempt}" for e in entries)))


def _row(entry: DeadLetter) -> tuple[str, str, float]:
    """What the store keeps of ``entry``: its member, its storable form's JSON, its time."""
    entry = storable_form(entry)
    return (f"{entry.task_id}:{entry.attempt}", json.dumps(entry.to_json(), default=str),
            entry.failed_at.timestamp())
