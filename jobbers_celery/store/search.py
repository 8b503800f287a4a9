"""Reads of the argument search (see :mod:`jobbers_celery.core.search`).

The index itself is written by the ``submit`` step that makes a record (``transition.lua``,
``spec.ix``: one sorted set per indexed path and value, in the record's shard, scored by
submission, trimmed to the newest ``MAX_PER_VALUE``) and its entries go with the record
(``prune.lua`` reads the record's ``ix`` field). So a search reads each shard's set and
merges them, newest first; an id whose record expired behind the index's back is tidied
away as it is met, as the other indexes are.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import cast

from jobbers_celery.core.records import TaskRecord
from jobbers_celery.core.search import SCAN_PAYLOAD_MAX
from jobbers_celery.store import reads
from jobbers_celery.store.keys import Keys
from jobbers_celery.store.sharded import Sharded

__all__ = ["indexed", "recent"]

#: Records read per round trip by :func:`recent` (each holds its payload).
_PAGE = 500


def indexed(s: Sharded, key: str, limit: int) -> list[TaskRecord]:
    """The newest ``limit`` tasks indexed under ``key`` (a digest), newest first (one
    pipeline for the ids, one for the records)."""
    if limit < 1:
        return []
    picked = _newest(s, lambda k: k.argument_index(key), limit)
    return reads._records(s, picked, lambda k: k.argument_index(key))


def recent(s: Sharded, name: str | None, limit: int
           ) -> tuple[list[tuple[TaskRecord, str | None]], int]:
    """The newest ``limit`` records of ``name`` (``None``: of every task) with their
    payloads (``msg``; ``None``: it holds none: completed, or a dead letter holds it), newest
    first, and how many the index holds in all."""
    def index(k: Keys) -> str:
        return k.name_index(name) if name is not None else k.all_tasks

    totals = s._pipeline_each([("zcard", (index(k),)) for k in s.shards.keys])
    total = sum(int(n) for n in totals)
    if limit < 1 or not total:
        return [], total
    picked = _newest(s, index, limit)
    shards = s.shards.keys
    out: list[tuple[TaskRecord, str | None]] = []
    for start in range(0, len(picked), _PAGE):
        page = picked[start:start + _PAGE]
        raws = s._pipeline_each([("hgetall", (shards[shard].task(task_id),))
                                 for shard, task_id in page])
        for (_, task_id), raw in zip(page, raws, strict=True):
            if raw:
                fields = cast("dict[str, str]", raw)
                msg = fields.get("msg")
                if msg is not None and len(msg) > SCAN_PAYLOAD_MAX:
                    msg = None  # not matched: what one search holds stays bounded
                out.append((reads._record(task_id, fields), msg))
    return out, total


def _newest(s: Sharded, index: Callable[[Keys], str], limit: int
            ) -> list[tuple[int, str]]:
    """``(shard, id)`` of the newest ``limit`` members of ``index`` over every shard."""
    replies = s._pipeline_each([("zrevrange", (index(k), 0, limit - 1, True))
                                for k in s.shards.keys])
    merged = heapq.merge(*([(-float(score), str(m), shard) for m, score in pairs]
                           for shard, pairs in enumerate(replies)))
    return [(shard, task_id) for _, task_id, shard in itertools.islice(merged, limit)]
