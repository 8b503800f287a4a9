"""The dead-letter part in memory: the default sink's entries, the dispatcher's outbox and
the set-aside list.

Why: with a sink that fails, the dispatcher parks an entry in the store's outbox; in memory
it must land here, where a test sees it (:attr:`MemoryDeadLetters.parked`), never on a
Redis socket or in a spool directory shared by every run on the machine.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator, Sequence

from jobbers_celery.core.records import DeadLetter
from jobbers_celery.testing.memory import Memory

__all__ = ["MemoryDeadLetters"]


class MemoryDeadLetters(Memory):
    """``DeadLetterStore`` over dicts and lists, under the shared lock."""

    def __init__(self) -> None:
        super().__init__()
        self._entries: dict[str, tuple[str, float]] = {}  # member -> (JSON, failed at)
        self._outbox: list[str] = []
        self._set_aside: list[str] = []  # newest first
        self._set_aside_total = 0

    def put_entries(self, entries: Sequence[tuple[str, str, float]], *, atomic: bool
                    ) -> None:
        with self._lock:
            for member, text, at in entries:
                self._entries.setdefault(member, (text, at))

    def entry_count(self) -> int:
        with self._lock:
            return len(self._entries)

    def entry_text(self, member: str) -> str | None:
        with self._lock:
            found = self._entries.get(member)
            return found[0] if found is not None else None

    def entry_texts(self, offset: int, count: int) -> list[str | None]:
        with self._lock:
            newest = sorted(self._entries.items(), key=lambda kv: (kv[1][1], kv[0]),
                            reverse=True)
            return [text for _, (text, _) in newest[offset:offset + count]]

    def entries_matching(self, pattern: str) -> Iterator[tuple[str, str]]:
        with self._lock:
            found = [(m, text) for m, (text, _) in self._entries.items()
                     if fnmatch.fnmatchcase(m, pattern)]
        return iter(found)

    def remove_entries(self, members: Sequence[str]) -> int:
        with self._lock:
            return sum(self._entries.pop(m, None) is not None for m in set(members))

    def outbox_push(self, texts: Sequence[str]) -> None:
        with self._lock:
            self._outbox.extend(texts)

    def outbox_head(self) -> str | None:
        with self._lock:
            return self._outbox[0] if self._outbox else None

    def outbox_remove(self, text: str) -> None:
        with self._lock:
            if text in self._outbox:
                self._outbox.remove(text)

    def set_aside_push(self, item: str, keep: int) -> int:
        with self._lock:
            self._set_aside.insert(0, item)
            length = len(self._set_aside)
            del self._set_aside[keep:]
            self._set_aside_total += 1
            return length

    def set_aside_read(self, limit: int) -> tuple[list[str], int, int]:
        with self._lock:
            return (self._set_aside[:limit], len(self._set_aside), self._set_aside_total)

    @property
    def parked(self) -> list[DeadLetter]:
        """The entries waiting in the outbox (the sink did not take them), oldest first."""
        with self._lock:
            texts = list(self._outbox)
        return [DeadLetter.from_json(json.loads(text)) for text in texts]
