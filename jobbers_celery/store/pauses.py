"""Pauses of a task name or a queue (see :mod:`jobbers_celery.core.pauses`), and the
tasks held because their name is paused.

The pauses live in one global hash every worker reads (at start, and every
``jobbers_pause_poll_interval``). A task name's pause is also copied into each shard's own
hash, so that ``hold.lua`` decides in the same script as the hold itself: a resume removes
the copy first, then releases what the shard holds, and a hold that comes after is refused
(the worker runs the task). No hold is ever left behind by a resume.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from jobbers_celery.core.pauses import HELD_DELAY_MS, Pause, PauseKind, field_of
from jobbers_celery.core.states import TaskState
from jobbers_celery.store.base import Claimed, StepResult
from jobbers_celery.store.scripts import EXPIRY_SLACK_S, as_int, to_json
from jobbers_celery.store.sharded import Sharded

__all__ = ["held_count", "held_ids", "hold", "oldest_submitted", "pause", "pauses", "release",
           "unpause"]

S = TaskState
#: Held ids a release reads and publishes per shard and call.
RELEASE_BATCH = 500
#: Submitted entries per shard :func:`oldest_submitted` reads at most.
OLDEST_SCAN = 2000


def pause(s: Sharded, kind: PauseKind, target: str, by: str) -> bool:
    """Record the pause (the global hash, and each shard's copy for a task name). Returns
    ``False`` when it was already paused (its time and author are kept)."""
    field = field_of(kind, target)
    value = to_json({"at": s.now_ms(), "by": by})
    new = bool(s.client.hsetnx(s.keys.pauses, field, value))
    if kind is PauseKind.TASK:
        for keys in s.shards.keys:
            if keys.pauses != s.keys.pauses:
                s.client.hsetnx(keys.pauses, field, value)
    return new


def unpause(s: Sharded, kind: PauseKind, target: str) -> bool:
    """Remove the pause (each shard's copy first, the global one last: a worker that still
    reads it paused has its hold refused). Returns whether it was paused."""
    field = field_of(kind, target)
    if kind is PauseKind.TASK:
        for keys in s.shards.keys:
            if keys.pauses != s.keys.pauses:
                s.client.hdel(keys.pauses, field)
    return bool(s.client.hdel(s.keys.pauses, field))


def pauses(s: Sharded) -> list[Pause]:
    """Every pause, oldest first."""
    out = []
    for field, raw in s.client.hgetall(s.keys.pauses).items():
        try:
            meta = json.loads(raw)
            got = Pause.parse(str(field), int(meta.get("at") or 0), str(meta.get("by") or ""))
        except (ValueError, TypeError, AttributeError):
            continue  # not ours: never fails the read of the others
        if got is not None:
            out.append(got)
    return sorted(out, key=lambda p: (p.at, p.kind, p.target))


def hold(s: Sharded, task_id: str, name: str, *, worker: str | None,
         reason: str) -> StepResult:
    """``submitted -> scheduled`` with no ``run_at`` while ``name`` is paused (``hold.lua``);
    refused ``not_paused`` when it no longer is."""
    shard = s.shards.index(task_id)
    sk = s.shards.keys[shard]
    keys, layout = s._shared_keys((S.SUBMITTED, S.SCHEDULED, S.CANCELLED), shard=shard)
    keys += [sk.task(task_id), sk.pauses, sk.held(name)]
    spec: dict[str, object] = {
        "id": task_id, "to": S.SCHEDULED.value, "from": [S.SUBMITTED.value],
        "delay_ms": HELD_DELAY_MS, "reason": reason, "cancellable": True,
        "ttl": s.retention_s + EXPIRY_SLACK_S}
    if worker:
        spec["worker"] = worker
    raw = s._scripts["hold"](keys=keys, args=[layout, to_json(spec),
                                              field_of(PauseKind.TASK, name)])
    applied = bool(int(raw[0]))
    return StepResult(applied=applied, previous=str(raw[1]), now_ms=int(raw[2]),
                      attempt=int(raw[3]), state=TaskState(str(raw[4])) if applied else None,
                      why=None if applied else str(raw[4]))


def held_ids(s: Sharded, name: str, limit: int = RELEASE_BATCH) -> list[list[str]]:
    """Per shard, the first ``limit`` ids held under ``name`` (oldest hold first)."""
    pipe = s.client.pipeline(transaction=False)
    for keys in s.shards.keys:
        pipe.zrange(keys.held(name), 0, limit - 1)
    return [[str(i) for i in ids] for ids in pipe.execute()]


def held_count(s: Sharded, name: str) -> int:
    """Tasks held under ``name`` (those cancelled while held included, until a release)."""
    pipe = s.client.pipeline(transaction=False)
    for keys in s.shards.keys:
        pipe.zcard(keys.held(name))
    return sum(int(n) for n in pipe.execute())


def release(s: Sharded, name: str, ids: Sequence[str], *, lease_ms: int,
            worker: str | None, reason: str) -> list[Claimed] | None:
    """Release held tasks ``ids`` of ``name`` (``release.lua``): each goes ``scheduled ->
    submitted`` under a publish lease, for the caller to publish (a scheduler publishes
    it when the lease runs out). ``None`` when ``name`` is paused again."""
    out: list[Claimed] = []
    for shard, group in s._by_shard(ids).items():
        sk = s.shards.keys[shard]
        keys, layout = s._shared_keys((S.SCHEDULED, S.SUBMITTED), shard=shard)
        keys += [sk.task(i) for i in group]
        keys += [sk.pauses, sk.held(name)]
        spec = {"ids": list(group), "lease_ms": int(lease_ms), "worker": worker or "",
                "reason": reason, "field": field_of(PauseKind.TASK, name)}
        raw = s._scripts["release"](keys=keys, args=[layout, to_json(spec)])
        if str(raw[0]) == "paused":
            return None
        out += [Claimed(task_id=str(raw[i]), msg=str(raw[i + 1]), retries=as_int(raw[i + 2]),
                        name=str(raw[i + 3]), run_at=None, queue=str(raw[i + 4]))
                for i in range(1, len(raw), 5)]
    return out


def oldest_submitted(s: Sharded, queues: Sequence[str], scan: int = OLDEST_SCAN
                     ) -> dict[str, tuple[int, str]]:
    """Per queue of ``queues``, the oldest task recorded ``submitted`` to it (not started:
    in the broker, or fetched by a worker): ``(submitted at ms, task id)``. Reads the
    oldest ``scan`` entries of each shard's submitted index and their queue (two
    pipelines); a queue whose oldest task is further in is missing from the answer. What
    a broker that cannot show its oldest message (AMQP) is told from."""
    wanted = set(queues)
    keys = s.shards.keys
    ranges = s._pipeline_each([("zrange", (k.state_index(S.SUBMITTED), 0, scan - 1, False,
                                           True)) for k in keys])
    pairs = [(str(i), int(float(score))) for got in ranges for i, score in got]
    if not pairs or not wanted:
        return {}
    names = s._pipeline_each([("hget", (s.shards.of(i).task(i), "queue")) for i, _ in pairs])
    out: dict[str, tuple[int, str]] = {}
    for (task_id, at), queue in zip(pairs, names, strict=True):
        if queue in wanted and (queue not in out or at < out[queue][0]):
            out[str(queue)] = (at, task_id)
    return out
