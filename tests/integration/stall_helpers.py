"""Helpers shared by the stall and cleaner tests (real Redis): a fake live worker that keeps
the clock ticking, and records of started tasks built through the store's own steps."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from jobbers_celery import TaskState
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.lifecycle.liveness import gaps
from jobbers_celery.store import RedisStore

S = TaskState

LOST_AFTER_S = 3.0       # proj: jobbers_worker_lost_after


@contextmanager
def ticking(store: RedisStore, wid: str = "live:1:tick00", period: float = 0.3) -> Iterator[str]:
    """A fake live worker: refreshes its liveness entry (and so ticks the clock) until exit,
    so no pause between cleaner passes looks like a Redis outage."""
    stop = threading.Event()
    gap = gaps(JobbersConfig(redis_url="redis://unused", worker_lost_after=LOST_AFTER_S,
                             cleaner_interval=1))

    def loop() -> None:
        while not stop.is_set():
            store.alive(wid, gap, [], int(LOST_AFTER_S * 1000))
            stop.wait(period)

    store.alive(wid, gap, [], int(LOST_AFTER_S * 1000))
    thread = threading.Thread(target=loop, name="test-ticker", daemon=True)
    thread.start()
    try:
        yield wid
    finally:
        stop.set()
        thread.join(10)


def resumed_at(store: RedisStore) -> int:
    """The end of the latest outage any shard's clock saw (ms; 0 if none)."""
    return max(int(store.client.hget(k.clock, "resumed_at") or 0) for k in store.shards.keys)


def last_seen(store: RedisStore, wid: str, at_ms: int | None = None) -> list[float | None]:
    """The worker incarnation's score in each shard's copy of the workers set; with
    ``at_ms``, first set it there (a worker last seen then)."""
    keys = store.shards.keys
    if at_ms is not None:
        for k in keys:
            store.client.zadd(k.workers, {wid: at_ms})
    return [store.client.zscore(k.workers, wid) for k in keys]


def fabricate(store: RedisStore, ids: list[str], *, wid: str, hb_ms: int | None,
              srec: int) -> None:
    """Records of started tasks, built through the store's own steps (as a worker would)."""
    msg = json.dumps({"args": [1, 2], "kwargs": {}, "options": {}})
    for task_id in ids:
        res = store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                         create={"name": "proj.add", "queue": "celery", "ver": "1", "dlq": "0"},
                         set_fields={"msg": msg, "retries": "0"}, reason="published",
                         name="proj.add")
        assert res.applied, res
        fields = {"srec": str(srec)}
        if hb_ms is not None:
            fields["hb_iv"] = str(hb_ms)
        res = store.step(task_id, S.STARTED, start=True, worker="ghost@localhost", wid=wid,
                         heartbeat_ms=hb_ms, set_fields=fields, name="proj.add")
        assert res.applied, res
        assert res.attempt == 1, res
