#!/usr/bin/env python
"""What does an indexed argument path cost in Redis memory, per task?

On a private ``redis-server``: ``--tasks`` records are written by the real ``submit`` step
(``RedisStore.submit``, ``transition.lua``), once without an index and once with one indexed
path, and ``MEMORY USAGE key SAMPLES 0`` is summed over the records and over the index keys
(``{prefix}:arg:<digest>``), for two shapes of value:

- ``unique``: every task has its own value (an order number): one sorted set per task;
- ``shared``: ``--per-value`` tasks share each value (a customer id): fewer, bigger sets.

The step writes the index in the same script as the record: no round trip of its own (a
ZADD and a ZCARD per indexed path).

    .venv/bin/python bench/search_index.py               # 2,000 tasks, 100 per shared value
    .venv/bin/python bench/search_index.py --json out.json
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

from _common import PrivateRedis, common_options, on_sys_path, write_json

on_sys_path()

import redis

from jobbers_celery.core.search import digest
from jobbers_celery.core.states import TaskState
from jobbers_celery.store import RedisStore


def fill(store: RedisStore, tasks: int, per_value: int | None, indexed: bool) -> list[str]:
    """``tasks`` submitted records (payload of 200 bytes), each indexed under its value
    when ``indexed``; returns their ids."""
    ids = []
    msg = '{"args":[],"kwargs":{"order_id":1,"note":"' + "x" * 160 + '"},"options":{}}'
    for n in range(tasks):
        task_id = str(uuid.uuid4())
        create = {"name": "bench.import_order", "queue": "celery"}
        if indexed:
            value = str(n if per_value is None else n // per_value)
            create["ix"] = digest("order_id", value)
        result = store.submit(task_id, sources=(TaskState.UNSUBMITTED,), create=create,
                              fields={"msg": msg}, reason="published",
                              name="bench.import_order")
        assert result.applied
        ids.append(task_id)
    return ids


def usage(client: redis.Redis, keys: list[str]) -> int:
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)


def measure(url: str, tasks: int, per_value: int | None) -> dict[str, Any]:
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    store = RedisStore(client, "jobbers", 3600, 1)
    plain = fill(store, tasks, per_value, indexed=False)
    plain_bytes = usage(client, [store.keys.task(i) for i in plain])
    client.flushdb()
    ids = fill(store, tasks, per_value, indexed=True)
    record_bytes = usage(client, [store.keys.task(i) for i in ids])
    index_keys = list(client.scan_iter(match="{jobbers}:arg:*", count=1000))
    index_bytes = usage(client, index_keys)
    client.close()
    return {"tasks": tasks, "per_value": per_value or 1, "index_keys": len(index_keys),
            "record_ix_bytes_per_task": round((record_bytes - plain_bytes) / tasks, 1),
            "index_bytes_per_task": round(index_bytes / tasks, 1),
            "total_bytes_per_task": round((record_bytes - plain_bytes + index_bytes) / tasks,
                                          1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--per-value", type=int, default=100,
                    help="tasks sharing one value in the shared shape")
    common_options(ap)
    args = ap.parse_args()
    server = PrivateRedis(args.redis_server)
    try:
        client = redis.Redis.from_url(server.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()
        results = {"unique": measure(server.url, args.tasks, None),
                   "shared": measure(server.url, args.tasks, args.per_value)}
    finally:
        server.stop()
    for shape, r in results.items():
        print(f"{shape:7} {r['tasks']:,} tasks, {r['per_value']} per value, "
              f"{r['index_keys']:,} index keys: {r['total_bytes_per_task']} bytes a task "
              f"(index {r['index_bytes_per_task']}, the record's ix field "
              f"{r['record_ix_bytes_per_task']})")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
