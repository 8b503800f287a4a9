"""The per-minute series' reads and settings (the ``SeriesStore`` part).

The writes are no part of this module: every step that starts or ends an attempt adds to
its minute inside its own script (``series_step`` in ``_lib.lua``), so history costs no
round trip of its own. A read asks every shard for the hour hashes of its window in one
pipeline per server (a shard holds the minutes of the tasks it holds) and sums them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from jobbers_celery.core.series import SeriesKind
from jobbers_celery.store.sharded import Sharded

__all__ = ["series_configure", "series_hours", "series_names"]


def series_hours(s: Sharded, kind: SeriesKind, names: Sequence[str],
                 hours: Sequence[int]) -> list[tuple[int, dict[str, str]]]:
    """Each stored hour hash of ``kind`` and each of ``names`` in ``hours``, per shard, in
    one pipeline: ``(hour, {minute: value})`` (summing is the caller's; an hour no shard
    holds is left out)."""
    if not hours or not names:
        return []
    asked = [(hour, keys.series(kind.value, hour, name))
             for keys in s.shards.keys for name in names for hour in hours]
    replies = s._pipeline_each([("hgetall", (key,)) for _, key in asked])
    return [(hour, cast("dict[str, str]", reply))
            for (hour, _), reply in zip(asked, replies, strict=True) if reply]


def series_names(s: Sharded, kind: SeriesKind, days: Sequence[int]) -> list[str]:
    """The names (or queues) the series of ``days`` hold, over every shard, sorted."""
    if not days:
        return []
    replies = s._pipeline_each([("zrange", (keys.series_index(kind.value, day), 0, -1))
                                for keys in s.shards.keys for day in days])
    found: set[str] = set()
    for reply in replies:
        found.update(cast("list[str]", reply))
    return sorted(found)


def series_configure(s: Sharded, days: float, cap: int) -> None:
    """Hand the history settings to the steps' script, in every shard (one pipeline): they
    read them when a name's minute first counts (their defaults without it)."""
    pipe = s.client.pipeline(transaction=False)
    for keys in s.shards.keys:
        pipe.hset(keys.series_conf, mapping={"days": f"{days:g}", "cap": str(cap)})
    pipe.execute()
