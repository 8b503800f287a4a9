"""Delayed tasks coming due (``due.lua``), claimed for publishing (``claim.lua``), and the
publish leases of what is being published."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.store.base import (
    Claimed,
)
from jobbers_celery.store.scripts import as_int, to_json
from jobbers_celery.store.sharded import Sharded

__all__ = ["claim", "confirm_published", "due", "release_publish_leases"]

log = escaped_logger("jobbers.store")


def due(s: Sharded, limit: int = 500) -> tuple[list[str], int | None]:
    """Ids worth claiming now (due, or lease expired) and the next run_at (ms) if any,
    over every shard (one pipeline; up to ``limit`` of each kind per shard)."""
    raw = s._scan(s._due_scan, [[k.state_index(TaskState.SCHEDULED), k.publishing]
                                      for k in s.shards.keys], [str(limit)])
    ids: list[str] = []
    nxt: int | None = None
    for due, expired, at in raw:  # per shard (nested: an id may hold any character)
        ids += [*due, *expired]
        if at not in ("", None):
            nxt = int(float(at)) if nxt is None else min(nxt, int(float(at)))
    return list(dict.fromkeys(ids)), nxt


def claim(s: Sharded, ids: Sequence[str], lease_ms: int, worker: str | None,
          released: Collection[str] = ()) -> list[Claimed]:
    """Atomically take due tasks (scheduled -> submitted) for this caller to publish;
    ``released``: parked tasks let go by the fair shares' release pass, due now."""
    if not ids:
        return []
    out: list[Claimed] = []
    for shard, group in s._by_shard(ids).items():
        out += _claim(s, shard, group, lease_ms, worker, released)
    return out


def _claim(s: Sharded, shard: int, ids: Sequence[str], lease_ms: int, worker: str | None,
           released: Collection[str] = ()) -> list[Claimed]:
    keys, states = s._shared_keys(
        (TaskState.UNSUBMITTED, TaskState.SCHEDULED, TaskState.SUBMITTED), shard=shard)
    sk = s.shards.keys[shard]
    for task_id in ids:
        keys.append(sk.task(task_id))
    spec = {
        "ids": list(ids),
        "lease_ms": int(lease_ms),
        "worker": worker or "",
        "from": [TaskState.SCHEDULED.value],
    }
    if released:
        spec["released"] = [i for i in ids if i in released]
    raw = s._scripts["claim"](keys=keys, args=[states, to_json(spec)])
    return [
        Claimed(task_id=str(raw[i]), msg=str(raw[i + 1]), retries=as_int(raw[i + 2]),
                name=str(raw[i + 3]),
                run_at=as_int(str(raw[i + 4])) if raw[i + 4] not in ("", None) else None,
                queue=str(raw[i + 5]))
        for i in range(0, len(raw), 6)
    ]


def release_publish_leases(s: Sharded, ids: Sequence[str]) -> None:
    """Make claimed-but-unpublished tasks due for any scheduler to publish now."""
    of = s.shards.of
    for group in s._by_shard(ids).values():
        s.client.zadd(of(group[0]).publishing, dict.fromkeys(group, 0), xx=True)


def confirm_published(s: Sharded, ids: Iterable[str]) -> None:
    """Drop publish leases once the messages are with the broker."""
    of = s.shards.of
    for group in s._by_shard(ids).values():
        s.client.zrem(of(group[0]).publishing, *group)
