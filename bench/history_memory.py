#!/usr/bin/env python
"""What does the per-minute history cost in Redis memory, per task name and day?

On a private ``redis-server``: first a real run of the steps' script (``RedisStore`` steps:
submitted, started, completed or failed) checks the key names and that each hour hash is a
listpack; then a day is filled, for ``--names`` task names, with the hour hashes those
steps write (the same keys, fields and value format, ``_lib.lua``'s ``series_step``), at
three activity levels:

- ``busy``: every minute of the day has work, at ``--rate`` tasks a second (values as
  large as such a minute writes: thousands of starts, sums of runtimes in ms);
- ``hourly``: work in one minute of every ten (a periodic task every 10 minutes);
- ``rare``: one minute an hour.

Measured with ``MEMORY USAGE key SAMPLES 0`` (the key, its value and Redis's per-key
overhead; the expiry entry aside), per task name and day, and the name's entry in the day's
index of names. The queue and the total series cost as much as one busy name each, once per
queue (not per name). The day is what a name costs ``jobbers_history_days`` times; with a
sharded layout (Redis Cluster) each shard that runs the name's tasks keeps its own hours.

    .venv/bin/python bench/history_memory.py               # 20 names per level, 20 tasks/s
    .venv/bin/python bench/history_memory.py --json out.json
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from _common import PrivateRedis, common_options, on_sys_path, wait_for, write_json

on_sys_path()

import redis

from jobbers_celery.core.series import DAY_MS, HOUR_MS, MINUTE_MS
from jobbers_celery.core.states import TaskState
from jobbers_celery.store import RedisStore

LEVELS = {"busy": 1, "hourly": 10, "rare": 60}  # one minute of work in every n


def minute_value(rate: float) -> str:
    """A minute's value as series_step writes it at ``rate`` tasks a second: 1 % failed,
    0.5 % retried, 35 ms mean queue latency, 850 ms mean runtime."""
    n = max(1, round(rate * 60))
    failed, retried = n // 100, n // 200
    started = n + retried
    return (f"{started} {started * 35} {started} {started * 850} {n - failed} {failed} "
            f"{retried}")


def real_run(store: RedisStore) -> dict[str, Any]:
    """A few tasks through the real script: the keys it wrote and their encoding."""
    for i in range(20):
        task_id = f"real-{i}"
        assert store.step(task_id, TaskState.SUBMITTED, sources=(TaskState.UNSUBMITTED,),
                          create={"name": "bench.real", "queue": "q", "ver": "1"},
                          reason="published", name="bench.real").applied
        assert store.step(task_id, TaskState.STARTED, start=True, worker="w").applied
        assert store.step(task_id, TaskState.COMPLETED if i % 10 else TaskState.FAILED).applied
    hour = store.now_ms() // HOUR_MS
    key = store.keys.series("n", hour, "bench.real")
    fields = store.client.hgetall(key)
    return {"key": key, "encoding": store.client.object("encoding", key),
            "ttl_s": store.client.ttl(key), "fields": fields,
            "bytes": store.client.memory_usage(key, samples=0)}


def fill(client: redis.Redis, store: RedisStore, level: str, every: int, names: int,
         rate: float, day: int) -> dict[str, Any]:
    value = minute_value(rate)
    per_name: list[int] = []
    for i in range(names):
        name = f"bench.{level}.task_{i:04d}"
        pipe = client.pipeline(transaction=False)
        keys = []
        for hour in range(day * 24, day * 24 + 24):
            fields = {str(m): value for m in range(60) if (hour * 60 + m) % every == 0}
            if fields:
                key = store.keys.series("n", hour, name)
                pipe.hset(key, mapping=fields)
                keys.append(key)
        index = store.keys.series_index("n", day)
        pipe.zadd(index, {name: day * 86_400_000})
        pipe.execute()
        total = sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)
        per_name.append(total)
        if keys:
            assert client.object("encoding", keys[0]) == "listpack", keys[0]
    index_bytes = int(client.memory_usage(store.keys.series_index("n", day), samples=0) or 0)
    mean = sum(per_name) / len(per_name)
    return {"level": level, "minutes_with_work": 1440 // every, "value": value,
            "bytes_per_name_day": round(mean), "index_bytes": index_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--names", type=int, default=20, help="task names per activity level")
    ap.add_argument("--rate", type=float, default=20.0,
                    help="tasks a second of a busy name (sizes the stored numbers)")
    common_options(ap)
    args = ap.parse_args()
    server = PrivateRedis(args.redis_server)
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(up, 10, "redis-server to answer")
        store = RedisStore(client, "bench", shards=1)
        real = real_run(store)
        print(f"real run: {real['key']} is a {real['encoding']} of {len(real['fields'])} "
              f"field(s), {real['bytes']} bytes, expires in {real['ttl_s']} s")
        day = int(time.time() * 1000) // DAY_MS + 1  # tomorrow: apart from the real run
        before = int(client.info("memory")["used_memory"])
        results = [fill(client, store, level, every, args.names, args.rate, day)
                   for level, every in LEVELS.items()]
        after = int(client.info("memory")["used_memory"])
        print(f"\nper task name and day (MEMORY USAGE, {args.names} names per level, a busy "
              f"name at {args.rate:g} tasks/s; value of a busy minute: "
              f"{minute_value(args.rate)!r}):")
        for r in results:
            print(f"  {r['level']:<7} {r['minutes_with_work']:>5} minutes with work: "
                  f"{r['bytes_per_name_day']:>7,} bytes/day, "
                  f"x7 days {7 * r['bytes_per_name_day'] / 1024:,.0f} KiB")
        print(f"  the day's index of {len(LEVELS) * args.names} names: "
              f"{results[-1]['index_bytes']:,} bytes")
        print(f"  used_memory grew by {after - before:,} bytes for "
              f"{len(LEVELS) * args.names} names (allocator overhead included)")
        print(f"  one minute's field: {MINUTE_MS // 1000} s of work; an hour's hash holds 60")
        write_json(args.json, {"real": {k: v for k, v in real.items() if k != "fields"},
                               "levels": results, "used_memory_delta": after - before,
                               "names": args.names, "rate": args.rate})
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
