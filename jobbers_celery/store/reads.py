"""Reads: records, histories, listings and counts; every read walks an index (one pipeline
per server), never the keyspace."""

from __future__ import annotations

import collections
import heapq
import itertools
import json
from collections.abc import Callable, Sequence
from typing import cast

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import ErrorInfo, TaskRecord, Transition, from_ms
from jobbers_celery.core.states import TaskState
from jobbers_celery.store.base import (
    StepResult,
)
from jobbers_celery.store.keys import STATE_ORDER, Keys
from jobbers_celery.store.scripts import as_int, maybe_json, to_json
from jobbers_celery.store.sharded import Sharded

__all__ = ["count_history", "counts", "fields", "get", "get_raw", "history", "refused_counts",
           "sample_counts", "scheduled", "started_by", "tasks"]

log = escaped_logger("jobbers.store")

#: How many index entries a filtered ``tasks()`` call examines at most.
_MAX_EXAMINED = 10_000


def get(s: Sharded, task_id: str) -> TaskRecord | None:
    raw = cast("dict[str, str]", s.client.hgetall(s.keys_of(task_id).task(task_id)))
    return _record(task_id, raw) if raw else None


def started_by(s: Sharded, task_id: str, wid: str) -> StepResult | None:
    """After a ``started`` step whose reply was lost (Redis went away once it was sent):
    its result if the record shows it applied (started by worker incarnation ``wid``),
    ``None`` if it did not apply and may be sent again."""
    raw = get_raw(s, task_id)
    if raw.get("state") != TaskState.STARTED.value or raw.get("wid") != wid:
        return None
    return StepResult(applied=True, previous=TaskState.SUBMITTED.value,
                      now_ms=int(raw.get("hb_at") or 0),
                      attempt=int(raw.get("attempt") or 0), state=TaskState.STARTED,
                      values={"ckpt": raw.get("ckpt", ""), "queue": raw.get("queue", "")})


def get_raw(s: Sharded, task_id: str) -> dict[str, str]:
    return cast("dict[str, str]", s.client.hgetall(s.keys_of(task_id).task(task_id)))


def history(s: Sharded, task_id: str) -> list[Transition]:
    raw = get_raw(s, task_id)
    return _history(task_id, raw)


def _history(task_id: str, raw: dict[str, str]) -> list[Transition]:
    """Parse the ``h1..hN`` entries of a record (format in ``_lib.lua``)."""
    out = []
    previous = TaskState.UNSUBMITTED
    base = as_int(raw.get("sub_at"))
    current = raw.get("worker") or ""
    for n in range(1, as_int(raw.get("hn")) + 1):
        entry = raw.get(f"h{n}")
        if entry is None:
            continue
        to, delta, attempt, worker, reason = entry.split("|", 4)
        worker = current if worker == "*" else worker
        state = TaskState(to)
        out.append(
            Transition(
                task_id=task_id,
                from_state=previous,
                to_state=state,
                at=from_ms(base + int(delta)),  # type: ignore[arg-type]
                attempt=int(attempt),
                worker=worker or None,
                reason=reason or None,
            )
        )
        previous = state
    return out


def fields(s: Sharded, ids: Sequence[str], names: Sequence[str]) -> list[list[str | None]]:
    """``HMGET`` of ``names`` for each id, in one round trip (per node on a cluster)."""
    of = s.shards.of
    return cast("list[list[str | None]]", s._pipeline_each(
        [("hmget", (of(task_id).task(task_id), list(names))) for task_id in ids]))


def counts(s: Sharded) -> dict[TaskState, int]:
    """Tasks per state, summed over the shards (one pipeline)."""
    replies = s._pipeline_each([("zcard", (k.state_index(state),))
                                   for k in s.shards.keys for state in STATE_ORDER])
    n = len(STATE_ORDER)
    count = len(s.shards.keys)
    return {state: sum(int(replies[j * n + i]) for j in range(count))
            for i, state in enumerate(STATE_ORDER)}


def sample_counts(s: Sharded, keep: int) -> bool:
    """Add :meth:`counts` to the count history unless this Redis-clock minute has a
    sample already (a lock per minute: one sample whichever worker asks first); keep
    the newest ``keep``. Returns whether it sampled."""
    now = s.now_ms()
    minute = now - now % 60_000
    if not s.client.set(s.keys.lock(f"counts:{minute}"), "1", nx=True, px=120_000):
        return False
    now_counts = {state.value: n for state, n in counts(s).items()}
    pipe = s.client.pipeline(transaction=True)
    pipe.zadd(s.keys.count_history, {to_json({"at": minute, "counts": now_counts}): minute})
    pipe.zremrangebyrank(s.keys.count_history, 0, -keep - 1)
    pipe.execute()
    return True


def count_history(s: Sharded, since_ms: int) -> list[tuple[int, dict[str, int]]]:
    """The count samples taken at or after ``since_ms``, oldest first: ``(minute ms,
    {state: n})``."""
    rows = cast("list[str]", s.client.zrangebyscore(s.keys.count_history,
                                                       since_ms, "+inf"))
    out = []
    for raw in rows:
        sample = json.loads(raw)
        out.append((int(sample["at"]), {str(k): int(v)
                                        for k, v in sample["counts"].items()}))
    return out


def scheduled(s: Sharded, limit: int = 100) -> list[TaskRecord]:
    """The next ``limit`` scheduled tasks, soonest first (each shard's soonest, merged)."""
    if limit < 1:
        return []
    shards = s.shards.keys
    replies = s._pipeline_each([
        ("zrange", (k.state_index(TaskState.SCHEDULED), 0, limit - 1, False, True))
        for k in shards])
    # ties ordered by id, as within one sorted set
    merged = heapq.merge(*([(float(score), str(i), shard) for i, score in pairs]
                           for shard, pairs in enumerate(replies)))
    picked = [(shard, task_id) for _, task_id, shard in itertools.islice(merged, limit)]
    return _records(s, picked, lambda k: k.state_index(TaskState.SCHEDULED))


def tasks(
    s: Sharded,
    state: TaskState | None = None,
    name: str | None = None,
    queue: str | None = None,
    limit: int = 100,
    worker: str | None = None,
) -> list[TaskRecord]:
    """Newest first. Walks the state or name index when given (else every task, newest
    first) and filters on the other criteria; a queue or a worker is a filter only (no
    index of its own: it would cost every record ~135 bytes). Each shard's index is read
    a page at a time (one pipeline for every shard that needs one) and the pages are
    merged by score, so the answer is the same as from one index; at most
    ``_MAX_EXAMINED`` records are examined in all."""
    if limit < 1:
        return []
    if state is not None:
        def index(k: Keys) -> str:
            return k.state_index(state)
    elif name is not None:
        def index(k: Keys) -> str:
            return k.name_index(name)
    else:
        def index(k: Keys) -> str:
            return k.all_tasks
    shards = s.shards.keys
    count = len(shards)
    batch = max(limit, 100)
    page = batch if count == 1 else batch // count + 16
    cursors = [0] * count
    buffers: list[collections.deque[tuple[float, str]]] = [
        collections.deque() for _ in range(count)]
    exhausted = [False] * count
    found: list[TaskRecord] = []
    examined = 0
    while len(found) < limit and examined < _MAX_EXAMINED:
        need = [i for i in range(count) if not buffers[i] and not exhausted[i]]
        if need:
            replies = s._pipeline_each([
                ("zrevrange", (index(shards[i]), cursors[i], cursors[i] + page - 1, True))
                for i in need])
            for i, pairs in zip(need, replies, strict=True):
                if not pairs:
                    exhausted[i] = True
                buffers[i].extend((float(score), str(m)) for m, score in pairs)
                cursors[i] += len(pairs)
        # newest first across the shards, until a shard's page runs out (it is read
        # further before anything older than its next entry is taken)
        picked: list[tuple[int, str]] = []
        while len(picked) < batch:
            heads = [(*buffers[i][0], i) for i in range(count) if buffers[i]]
            if not heads:
                break
            i = max(heads)[2]  # ties by id, as within one sorted set
            picked.append((i, buffers[i].popleft()[1]))
            if not buffers[i] and not exhausted[i]:
                break
        if not picked:
            break
        examined += len(picked)
        records = _records(s, picked, index, cursors)
        for record in records:
            if ((state is None or record.state == state)
                    and (name is None or record.name == name)
                    and (queue is None or record.queue == queue)
                    and (worker is None or record.worker == worker)):
                found.append(record)
                if len(found) == limit:
                    break
    return found


def _records(s: Sharded, picked: Sequence[tuple[int, str]], index: Callable[[Keys], str],
             cursors: list[int] | None = None) -> list[TaskRecord]:
    """The records of ``(shard, id)`` pairs, in order (one pipeline). An id whose record
    expired behind its index's back leaves ``index`` here (lazily tidied), and the
    shard's read position in ``cursors`` moves back by one: what followed it moved up."""
    shards = s.shards.keys
    raws = s._pipeline_each([("hgetall", (shards[shard].task(task_id),))
                                for shard, task_id in picked])
    out = []
    gone: dict[int, list[str]] = {}
    for (shard, task_id), raw in zip(picked, raws, strict=True):
        if raw:
            out.append(_record(task_id, raw))
        else:
            gone.setdefault(shard, []).append(task_id)
    for shard, ids in gone.items():
        s.client.zrem(index(shards[shard]), *ids)
        if cursors is not None:
            cursors[shard] -= len(ids)
    return out


def _record(task_id: str, raw: dict[str, str]) -> TaskRecord:
    err = maybe_json(raw.get("err"))
    return TaskRecord(
        task_id=task_id,
        name=raw.get("name", ""),
        version=as_int(raw.get("ver")) if raw.get("ver") not in (None, "") else None,
        queue=raw.get("queue") or None,
        state=TaskState(raw.get("state", TaskState.UNSUBMITTED)),
        attempt=as_int(raw.get("attempt")),
        retry_attempt=as_int(raw.get("retries")),
        submitted_at=from_ms(raw.get("sub_at")),
        started_at=from_ms(raw.get("start_at")),
        retried_at=from_ms(raw.get("retry_at")),
        completed_at=from_ms(raw.get("done_at")),
        heartbeat_at=from_ms(raw.get("hb_at")),
        run_at=from_ms(raw.get("run_at")),
        worker=raw.get("worker") or None,
        error=ErrorInfo(str(err.get("type", "")), str(err.get("message", "")))
        if isinstance(err, dict) else None,
        progress=maybe_json(raw.get("progress")),
        checkpoint=maybe_json(raw.get("ckpt")),
        root_id=raw.get("root") or None,
        parent_id=raw.get("par") or None,
        group_id=raw.get("grp") or None,
    )


def refused_counts(s: Sharded) -> dict[str, int]:
    """The refusal counters, summed over the shards."""
    out: dict[str, int] = {}
    for raw in s._pipeline_each([("hgetall", (k.stats,)) for k in s.shards.keys]):
        for key, value in raw.items():
            out[key] = out.get(key, 0) + int(value)
    return out
