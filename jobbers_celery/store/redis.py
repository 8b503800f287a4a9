"""RedisStore: every lifecycle step is one Lua call; every read walks an index.

The allowed source states of each step come from :mod:`jobbers_celery.states`, so the
scripts compare-and-set against the same table that the Python code documents.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any, cast

import redis

from jobbers_celery.records import ErrorInfo, TaskRecord, Transition, from_ms
from jobbers_celery.states import TERMINAL, TaskState, allowed_from
from jobbers_celery.store.base import Claimed, ResultWrite, StepResult
from jobbers_celery.store.fastcall import FastScript
from jobbers_celery.store.keys import STATE_ORDER, Keys

__all__ = ["RedisStore"]

log = logging.getLogger("jobbers.store")

#: Terminal records stay this much longer than the retention period so that the pruner,
#: which needs their name and queue to clean the indexes, always sees them first.
_EXPIRY_SLACK_S = 3600
#: How many index entries a filtered ``tasks()`` call examines at most.
_MAX_EXAMINED = 10_000


@cache
def _script_source(name: str) -> str:
    lua = resources.files("jobbers_celery.store").joinpath("lua")
    return lua.joinpath("_lib.lua").read_text() + "\n" + lua.joinpath(f"{name}.lua").read_text()


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _maybe_json(raw: str | None) -> Any:
    if raw is None or raw == "":
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _int(raw: str | None, default: int = 0) -> int:
    return int(raw) if raw not in (None, "") else default


class RedisStore:
    """Typed access to the lifecycle records of one jobbers namespace."""

    def __init__(self, client: redis.Redis, prefix: str = "jobbers", retention: float = 604800):
        self.client = client
        self.keys = Keys(prefix)
        self.retention_s = int(retention)
        self._layouts: dict[frozenset[TaskState], tuple[list[str], str]] = {}
        self._scripts = {
            name: client.register_script(_script_source(name))
            for name in ("transition", "complete", "claim", "prune")
        }
        self._transition = FastScript(client, self._scripts["transition"])
        self._complete = FastScript(client, self._scripts["complete"])
        self._due = client.register_script(
            resources.files("jobbers_celery.store").joinpath("lua", "due.lua").read_text()
        )

    @classmethod
    def from_url(cls, url: str, prefix: str = "jobbers", retention: float = 604800) -> RedisStore:
        client = redis.Redis.from_url(url, decode_responses=True, health_check_interval=30)
        return cls(client, prefix, retention)

    # ------------------------------------------------------------------ steps
    def _shared_keys(self, states: Iterable[TaskState]) -> tuple[list[str], str]:
        """The shared KEYS prefix of every script and the matching ARGV[1].

        Only the indexes of ``states`` are passed: a step touches the index of its current
        state (one of its sources) and of its target, nothing else. Cached per state set.
        """
        wanted = frozenset(states)
        cached = self._layouts.get(wanted)
        if cached is None:
            ordered = [s for s in STATE_ORDER if s in wanted]
            k = self.keys
            cached = (
                [k.all_tasks, k.publishing, k.stats, *(k.state_index(s) for s in ordered)],
                json.dumps([s.value for s in ordered]),
            )
            self._layouts[wanted] = cached
        return list(cached[0]), cached[1]

    def step(
        self,
        task_id: str,
        to: TaskState,
        *,
        sources: Iterable[TaskState] | None = None,
        fence: int | None = None,
        create: dict[str, str] | None = None,
        set_fields: dict[str, str] | None = None,
        delete: Sequence[str] = (),
        start: bool = False,
        delay_ms: int | None = None,
        lease_ms: int | None = None,
        worker: str | None = None,
        reason: str | None = None,
        ret: Sequence[str] = (),
        name: str | None = None,
        queue: str | None = None,
        write_result: ResultWrite | None = None,
    ) -> StepResult:
        """Apply ``-> to`` atomically if the task is in one of ``sources`` (default: the table).

        ``sources`` may narrow the table's sources, never widen them. ``write_result``: also write
        Celery's result in the same script if (and only if) the step applies, so that the
        record and the result never disagree and the write costs no round trip of its own.
        """
        table = allowed_from(to)
        src = table if sources is None else frozenset(sources)
        if not src <= table:
            raise ValueError(f"{sorted(src - table)} -> {to} is not in the transition table")
        spec: dict[str, Any] = {
            "id": task_id,
            "to": to.value,
            "from": sorted(s.value for s in src),
        }
        if fence is not None:
            spec["fence"] = fence
        if create is not None:
            spec["create"] = create
        if set_fields:
            spec["set"] = set_fields
        if delete:
            spec["del"] = list(delete)
        if start:
            spec["start"] = True
        if delay_ms is not None:
            spec["delay_ms"] = int(delay_ms)
        if lease_ms is not None:
            spec["lease_ms"] = int(lease_ms)
        if to in TERMINAL:
            spec["ttl"] = self.retention_s + _EXPIRY_SLACK_S
        if worker:
            spec["worker"] = worker
        if reason:
            spec["reason"] = reason
        if ret:
            spec["ret"] = list(ret)
        keys, states = self._shared_keys(src | {to})
        keys += [self.keys.task(task_id), self.keys.history(task_id)]
        if create is not None:
            keys += [self.keys.name_index(name or ""), self.keys.queue_index(queue or "")]
        if write_result is not None:
            if create is not None:
                raise ValueError("a step that writes a result cannot create the record")
            keys.append(write_result.key)
            raw = self._complete(
                keys, [states, _json(spec), write_result.value, str(write_result.expires)])
        else:
            raw = self._transition(keys, [states, _json(spec)])
        applied = bool(int(raw[0]))
        result = StepResult(
            applied=applied,
            previous=str(raw[1]),
            now_ms=int(raw[2]),
            attempt=int(raw[3]),
            values=dict(zip(ret, (str(v) for v in raw[4:]), strict=False)) if applied else {},
            why=None if applied else str(raw[4]),
        )
        if not applied:
            log.warning(
                "refused transition %s -> %s of task %s (%s, attempt %s, fence %s)",
                result.previous, to.value, task_id, result.why, result.attempt, fence,
            )
        return result

    # ------------------------------------------------------------------ scheduler
    def due(self, limit: int = 500) -> tuple[list[str], int | None]:
        """Ids worth claiming now (due, or lease expired) and the next run_at (ms) if any."""
        raw = self._due(
            keys=[self.keys.state_index(TaskState.SCHEDULED), self.keys.publishing],
            args=[limit],
        )
        first = raw.index("|")
        second = raw.index("|", first + 1)
        ids = list(dict.fromkeys([*raw[:first], *raw[first + 1:second]]))
        nxt = raw[second + 1]
        return ids, int(float(nxt)) if nxt not in ("", None) else None

    def claim(self, ids: Sequence[str], lease_ms: int, worker: str | None) -> list[Claimed]:
        """Atomically take due tasks (scheduled -> submitted) for this caller to publish."""
        if not ids:
            return []
        keys, states = self._shared_keys((TaskState.SCHEDULED, TaskState.SUBMITTED))
        for task_id in ids:
            keys += [self.keys.task(task_id), self.keys.history(task_id)]
        spec = {
            "ids": list(ids),
            "lease_ms": int(lease_ms),
            "worker": worker or "",
            "from": [TaskState.SCHEDULED.value],
        }
        raw = self._scripts["claim"](keys=keys, args=[states, _json(spec)])
        return [
            Claimed(task_id=str(raw[i]), msg=str(raw[i + 1]), retries=_int(raw[i + 2]),
                    name=str(raw[i + 3]))
            for i in range(0, len(raw), 4)
        ]

    def confirm_published(self, ids: Iterable[str]) -> None:
        """Drop publish leases once the messages are with the broker."""
        ids = list(ids)
        if ids:
            self.client.zrem(self.keys.publishing, *ids)

    def try_lock(self, name: str, ttl_ms: int) -> bool:
        """Take a best-effort lock that expires by itself (efficiency only, never safety)."""
        return bool(self.client.set(self.keys.lock(name), "1", nx=True, px=ttl_ms))

    def now_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def prune(self, limit: int = 500) -> int:
        """Remove terminal records older than the retention period; returns how many."""
        cutoff = self.now_ms() - self.retention_s * 1000
        ids: list[str] = []
        for state in TERMINAL:
            ids += cast("list[str]", self.client.zrangebyscore(
                self.keys.state_index(state), "-inf", cutoff, start=0, num=limit
            ))
        if not ids:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for task_id in ids:
            pipe.hmget(self.keys.task(task_id), ["name", "queue"])
        meta = pipe.execute()
        keys, states = self._shared_keys(TERMINAL)
        for task_id, (name, queue) in zip(ids, meta, strict=True):
            keys += [
                self.keys.task(task_id),
                self.keys.history(task_id),
                self.keys.name_index(name or ""),
                self.keys.queue_index(queue or ""),
            ]
        spec = {"ids": ids, "cutoff_ms": cutoff, "terminal": sorted(s.value for s in TERMINAL)}
        return int(self._scripts["prune"](keys=keys, args=[states, _json(spec)]))

    # ------------------------------------------------------------------ reads
    def get(self, task_id: str) -> TaskRecord | None:
        raw = cast("dict[str, str]", self.client.hgetall(self.keys.task(task_id)))
        return self._record(task_id, raw) if raw else None

    def get_raw(self, task_id: str) -> dict[str, str]:
        return cast("dict[str, str]", self.client.hgetall(self.keys.task(task_id)))

    def history(self, task_id: str) -> list[Transition]:
        out = []
        for item in self.client.lrange(self.keys.history(task_id), 0, -1):
            src, dst, at, attempt, worker, reason = json.loads(item)
            out.append(
                Transition(
                    task_id=task_id,
                    from_state=TaskState(src),
                    to_state=TaskState(dst),
                    at=from_ms(at),  # type: ignore[arg-type]
                    attempt=int(attempt),
                    worker=worker,
                    reason=reason,
                )
            )
        return out

    def counts(self) -> dict[TaskState, int]:
        pipe = self.client.pipeline(transaction=False)
        for state in STATE_ORDER:
            pipe.zcard(self.keys.state_index(state))
        return {s: int(n) for s, n in zip(STATE_ORDER, pipe.execute(), strict=True)}

    def scheduled(self, limit: int = 100) -> list[TaskRecord]:
        ids = cast("list[str]",
                   self.client.zrange(self.keys.state_index(TaskState.SCHEDULED), 0, limit - 1))
        return self._records(ids, self.keys.state_index(TaskState.SCHEDULED))

    def tasks(
        self,
        state: TaskState | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        """Newest first. Walks the most selective index given and filters on the others."""
        if limit < 1:
            return []
        if state is not None:
            index = self.keys.state_index(state)
        elif name is not None:
            index = self.keys.name_index(name)
        elif queue is not None:
            index = self.keys.queue_index(queue)
        else:
            index = self.keys.all_tasks
        found: list[TaskRecord] = []
        offset, batch = 0, max(limit, 100)
        while len(found) < limit and offset < _MAX_EXAMINED:
            ids = cast("list[str]", self.client.zrevrange(index, offset, offset + batch - 1))
            if not ids:
                break
            records = self._records(ids, index)
            # _records removed the ids whose hash is gone from this index: later ones moved up
            offset += len(records)
            for record in records:
                if ((state is None or record.state == state)
                        and (name is None or record.name == name)
                        and (queue is None or record.queue == queue)):
                    found.append(record)
                    if len(found) == limit:
                        break
        return found

    def _records(self, ids: Sequence[str], index: str) -> list[TaskRecord]:
        pipe = self.client.pipeline(transaction=False)
        for task_id in ids:
            pipe.hgetall(self.keys.task(task_id))
        out, gone = [], []
        for task_id, raw in zip(ids, pipe.execute(), strict=True):
            if raw:
                out.append(self._record(task_id, raw))
            else:
                gone.append(task_id)
        if gone:  # expired behind the index's back: tidy up lazily
            self.client.zrem(index, *gone)
        return out

    @staticmethod
    def _record(task_id: str, raw: dict[str, str]) -> TaskRecord:
        err = _maybe_json(raw.get("err"))
        return TaskRecord(
            task_id=task_id,
            name=raw.get("name", ""),
            version=_int(raw.get("ver")) if raw.get("ver") not in (None, "") else None,
            queue=raw.get("queue") or None,
            state=TaskState(raw.get("state", TaskState.UNSUBMITTED)),
            attempt=_int(raw.get("attempt")),
            retry_attempt=_int(raw.get("retries")),
            submitted_at=from_ms(raw.get("sub_at")),
            started_at=from_ms(raw.get("start_at")),
            retried_at=from_ms(raw.get("retry_at")),
            completed_at=from_ms(raw.get("done_at")),
            heartbeat_at=from_ms(raw.get("hb_at")),
            run_at=from_ms(raw.get("run_at")),
            worker=raw.get("worker") or None,
            error=ErrorInfo(str(err.get("type", "")), str(err.get("message", "")))
            if isinstance(err, dict) else None,
            progress=_maybe_json(raw.get("progress")),
            checkpoint=_maybe_json(raw.get("ckpt")),
        )

    def refused_counts(self) -> dict[str, int]:
        raw = cast("dict[str, str]", self.client.hgetall(self.keys.stats))
        return {k: int(v) for k, v in raw.items()}
