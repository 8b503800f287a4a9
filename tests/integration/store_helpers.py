"""Helpers shared by the RedisStore tests: build records in a given state, snapshot them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jobbers_celery.core.states import TERMINAL, TaskState
from jobbers_celery.store import RedisStore, StepResult

S = TaskState

NAME = "proj.work"
QUEUE = "default"
#: Delay used when a record is parked in ``scheduled`` and must not become due during a test.
FAR_DELAY_MS = 600_000


@contextmanager
def store_factory(redis_url: str) -> Iterator[Callable[..., RedisStore]]:
    """``make(prefix=..., retention=..., shards=...)``: RedisStores, each on its own
    connection pool, closed on exit; the sharded layout (16) unless ``shards`` says
    otherwise. Test modules wrap it in their ``make_store`` fixture."""
    stores: list[RedisStore] = []

    def make(prefix: str = "jt", retention: float = 604800, shards: int = 16) -> RedisStore:
        store = RedisStore.from_url(redis_url, prefix=prefix, retention=retention,
                                    shards=shards)
        stores.append(store)
        return store

    try:
        yield make
    finally:
        for store in stores:
            store.client.close()


def create(store: RedisStore, task_id: str, name: str = NAME, queue: str = QUEUE,
           **fields: str) -> StepResult:
    """missing -> submitted, as a publish records it."""
    res = store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                     create={"name": name, "queue": queue, "ver": "1", **fields},
                     set_fields={"msg": '{"args": [1, 2], "kwargs": {}, "options": {}}',
                                 "retries": "0"},
                     reason="published", name=name)
    assert res.applied, res
    return res


def step_kwargs(to: TaskState) -> dict[str, Any]:
    """What a real caller passes along with a step into ``to``."""
    if to == S.STARTED:
        return {"start": True, "worker": "w1@host"}
    if to == S.SCHEDULED:
        return {"delay_ms": FAR_DELAY_MS}
    return {}


def put_in_state(store: RedisStore, task_id: str, state: TaskState, name: str = NAME,
                 queue: str = QUEUE) -> list[StepResult]:
    """Build a record in ``state`` through legal steps only; returns the step results."""
    results = [create(store, task_id, name, queue)]
    if state == S.SUBMITTED:
        return results
    path: list[TaskState] = [S.STARTED]
    if state == S.UNSUBMITTED:
        path.append(S.UNSUBMITTED)
    elif state != S.STARTED:
        path.append(state)
    for to in path:
        res = store.step(task_id, to, **step_kwargs(to))
        assert res.applied, (to, res)
        results.append(res)
    assert store.client.hget(store.keys_of(task_id).task(task_id), "state") == state.value
    return results


def indexed_states(store: RedisStore, task_id: str) -> set[TaskState]:
    pipe = store.client.pipeline(transaction=False)
    for s in TaskState:
        pipe.zscore(store.keys_of(task_id).state_index(s), task_id)
    return {s for s, score in zip(TaskState, pipe.execute(), strict=True) if score is not None}


def assert_indexed_only_in(store: RedisStore, task_id: str, state: TaskState) -> None:
    assert indexed_states(store, task_id) == {state}


def snapshot(store: RedisStore, task_id: str) -> dict[str, Any]:
    """Everything a step may touch for one task (hash with its history, TTL, every index)."""
    k = store.keys_of(task_id)
    c = store.client
    index_keys = [*k.state_indexes(), k.all_tasks, k.publishing, k.name_index(NAME)]
    return {
        "hash": c.hgetall(k.task(task_id)),
        "history": store.history(task_id),
        "ttl": c.ttl(k.task(task_id)),
        "index": {key: c.zscore(key, task_id) for key in index_keys},
    }


def is_terminal(state: TaskState) -> bool:
    return state in TERMINAL
