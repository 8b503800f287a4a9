"""The argument search's reads in memory (the ``SearchStore`` part).

The index is read off the records: a record's ``ix`` field names the digests its ``submit``
step indexed it under (as ``transition.lua`` writes them, from the same
:mod:`jobbers_celery.core.search` rule), so an index entry goes with its record here, as
``prune.lua`` removes it with the record in Redis. The per-value bound
(``MAX_PER_VALUE``) is applied to what is read.
"""

from __future__ import annotations

from jobbers_celery.core.records import TaskRecord
from jobbers_celery.core.search import MAX_PER_VALUE, SCAN_PAYLOAD_MAX
from jobbers_celery.testing.memory import Memory, record_of

__all__ = ["MemorySearch"]


class MemorySearch(Memory):
    """``indexed`` and ``recent`` over the in-memory records."""

    def _newest(self, keep: dict[str, dict[str, str]]) -> list[tuple[str, dict[str, str]]]:
        return sorted(keep.items(), key=lambda item: (int(item[1].get("sub_at") or 0),
                                                      item[0]), reverse=True)

    def indexed(self, key: str, limit: int) -> list[TaskRecord]:
        with self._lock:
            hits = {i: dict(r) for i, r in self._records.items()
                    if key in (r.get("ix") or "").split()}
        newest = self._newest(hits)[:min(limit, MAX_PER_VALUE)]
        return [record_of(i, r) for i, r in newest]

    def recent(self, name: str | None, limit: int
               ) -> tuple[list[tuple[TaskRecord, str | None]], int]:
        with self._lock:
            rows = {i: dict(r) for i, r in self._records.items()
                    if name is None or r.get("name") == name}
        newest = self._newest(rows)[:max(limit, 0)]
        return [(record_of(i, r), _bounded(r.get("msg"))) for i, r in newest], len(rows)


def _bounded(msg: str | None) -> str | None:
    """As the store reads it: a payload past SCAN_PAYLOAD_MAX is not matched."""
    return msg if msg is None or len(msg) <= SCAN_PAYLOAD_MAX else None
