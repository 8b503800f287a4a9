"""Workflows (the ``WorkflowStore`` part): a canvas's members read through its index, and
its cancel mark.

A workflow's index is kept per shard (``Keys.workflow``): each member's ``submit`` step
enters it in its own shard, in the same script as its record (no round trip of its own, one
slot per script on Redis Cluster). So a read asks every shard, one pipeline per server:
which workflow an id names, then its members (each shard's first ``limit``, merged by
submission time), then their records. Three round trips, whatever the number of members
(at most ``limit`` records read); never a keyspace scan.
"""

from __future__ import annotations

import heapq
import itertools
from typing import cast

from redis.exceptions import NoPermissionError, ResponseError

from jobbers_celery.core.records import from_ms
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.workflow import MemberRead, WorkflowRead
from jobbers_celery.store.keys import STATE_ORDER
from jobbers_celery.store.reads import _history, _record
from jobbers_celery.store.scripts import EXPIRY_SLACK_S
from jobbers_celery.store.sharded import Sharded

__all__ = ["mark_workflow_cancelled", "workflow"]


def _resolve(s: Sharded, task_id: str) -> str | None:
    """The workflow key ``task_id`` names: its record's (a member, or a task published
    alone, which names itself), else its own if it keys an index (a top-level group's id),
    else the one it is an alias of (a nested group's id, a chord callback's or a chain's
    last link's before it is recorded); ``None`` if none."""
    shards = s.shards.keys
    n = len(shards)
    replies = s._pipeline_each(
        [("hmget", (s.keys_of(task_id).task(task_id), ["state", "wf"]))]
        + [("exists", (k.workflow(task_id),)) for k in shards]
        + [("get", (k.workflow_alias(task_id),)) for k in shards])
    state, key = replies[0]
    if state is not None:
        return str(key or task_id)
    if any(int(found) for found in replies[1:1 + n]):
        return task_id
    return next((str(g) for g in replies[1 + n:] if g), None)


def workflow(s: Sharded, task_id: str, limit: int) -> WorkflowRead | None:
    """See :meth:`WorkflowStore.workflow <jobbers_celery.store.parts.WorkflowStore.workflow>`."""
    key = _resolve(s, task_id)
    if key is None:
        return None
    shards = s.shards.keys
    n = len(shards)
    home = s.keys_of(key)
    replies = s._pipeline_each(
        [("zrange", (k.workflow(key), 0, limit - 1, False, True)) for k in shards]
        + [("zcard", (k.workflow(key),)) for k in shards]
        + [("get", (k.workflow_cancelled(key),)) for k in shards]
        + [("hmget", (home.task(key), ["sub_at", "state"])),
           ("zscore", (home.workflow(key), key))])
    total = sum(int(c) for c in replies[n:2 * n])
    marks = [int(m) for m in replies[2 * n:3 * n] if m]
    (root_at, root_state), root_indexed = replies[3 * n], replies[3 * n + 1]
    alone = root_at is not None and root_indexed is None  # a root published alone
    runs = [[(float(score), str(i), shard) for i, score in pairs]
            for shard, pairs in enumerate(replies[:n])]
    if alone:  # it is its own member
        runs.append([(float(root_at), key, s.shards.index(key))])
        total += 1
    picked = [(shard, i) for _, i, shard in itertools.islice(heapq.merge(*runs), limit)]
    if not picked:
        return None
    raws = cast("list[dict[str, str]]", s._pipeline_each(
        [("hgetall", (shards[shard].task(i),)) for shard, i in picked]))
    members: list[MemberRead] = []
    gone: dict[int, list[str]] = {}
    for (shard, i), raw in zip(picked, raws, strict=True):
        if not raw:  # expired or removed behind the index's back: tidied lazily
            gone.setdefault(shard, []).append(i)
            continue
        members.append(MemberRead(_record(i, raw), _history(i, raw),
                                  chord=raw.get("chd") or None,
                                  successors=raw.get("nxt") == "1"))
    for shard, ids in gone.items():
        s.client.zrem(shards[shard].workflow(key), *ids)
    if not members:
        return None
    truncated = total > limit
    return WorkflowRead(key, members, total - sum(len(ids) for ids in gone.values()),
                        cancelled_at=from_ms(min(marks)) if marks else None,
                        truncated=truncated,
                        states=_states(s, key, root_state if alone else None) if truncated
                        else None)


def _states(s: Sharded, key: str, root: str | None) -> dict[TaskState, int] | None:
    """How many of the workflow's members are in each state, counted in the indexes (each
    shard's workflow index intersected with its state indexes: ``ZINTERCARD``, Redis 7),
    without reading a record: the state and counts of a workflow read in part. ``root``:
    the state of a root published alone (in no index). ``None`` on a Redis older than 7
    (no ``ZINTERCARD``), or for an ACL user without it: the counts then cover the members
    read."""
    shards = s.shards.keys
    try:
        replies = s._pipeline_each([("zintercard", (2, [k.workflow(key), k.state_index(state)]))
                                    for k in shards for state in STATE_ORDER])
    except ResponseError as exc:
        if "unknown command" not in str(exc).lower() and not isinstance(exc, NoPermissionError):
            raise
        return None
    n = len(STATE_ORDER)
    out = {state: sum(int(replies[j * n + i]) for j in range(len(shards)))
           for i, state in enumerate(STATE_ORDER)}
    if root:
        out[TaskState(root)] += 1
    return out


def mark_workflow_cancelled(s: Sharded, root_id: str, cancelled: bool) -> None:
    """See :meth:`WorkflowStore.mark_workflow_cancelled
    <jobbers_celery.store.parts.WorkflowStore.mark_workflow_cancelled>`: the mark is set in
    every shard (a member's step reads its own shard's), kept for the retention period."""
    shards = s.shards.keys
    if cancelled:
        now = s.now_ms()
        ttl = s.retention_s + EXPIRY_SLACK_S
        s._pipeline_each([("set", (k.workflow_cancelled(root_id), now, ttl, None, True))
                          for k in shards])
    else:
        s._pipeline_each([("delete", (k.workflow_cancelled(root_id),)) for k in shards])
