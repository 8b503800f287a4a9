#!/usr/bin/env python
"""What does ``unique=`` cost a publish? (docs/howto/unique.md)

On a private ``redis-server`` (broker, result backend and state store), a fresh process per
variant and round publishes ``--tasks`` tasks (each its own key: every publish takes a
lock) after a warm-up, and reports the time per publish and the Redis commands it sent
(``INFO commandstats`` before and after: the store's round trips are its script calls,
``evalsha``; the commands the scripts run are listed too, but cost no round trip). The wall
time is as noisy as the machine is busy: the publisher's CPU time and the Redis time spent
in the store's scripts (``commandstats`` usec) are reported too. Variants, interleaved
round by round (A B, B A, ...):

- ``plain``: ``@app.task(base=JobbersTask)``;
- ``unique``: the same task with ``unique=Unique(on=(0,))`` (until its end);
- ``plain16``, ``unique16`` (``--shards``): the same on the sharded layout (16 shards),
  where the lock lives in the global slot and is taken by one call before the step.

Target: a unique publish costs at most one store call more than a plain one on the sharded
layout, none on one Redis; the time ratio is reported (median [min-max] of the rounds).

    .venv/bin/python bench/unique.py                 # 6 rounds of 2,000 publishes
    .venv/bin/python bench/unique.py --rounds 4 --tasks 1000 --shards --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

from _common import (
    PrivateRedis,
    Spread,
    banner,
    code_version,
    commands_since,
    common_options,
    exit_code,
    failed,
    interleaved_rounds,
    on_sys_path,
    per_task,
    ping,
    verdict,
    wait_for,
    write_json,
)

on_sys_path()



def child(variant: str, url: str, tasks: int, warmup: int) -> dict[str, Any]:
    """One variant's publishes in this (fresh) process; what the parent prints."""
    import redis
    from celery import Celery

    from jobbers_celery import JobbersTask, install
    from jobbers_celery.core.unique import Unique

    shards = 16 if variant.endswith("16") else 1
    app = Celery("bench_unique", broker=url, backend=url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], jobbers_redis_url=url,
                    jobbers_store_shards=shards, jobbers_key_prefix=f"b{shards}")
    install(app)
    opts: dict[str, Any] = {"unique": Unique(on=(0,))} if variant.startswith("u") else {}

    @app.task(base=JobbersTask, name=f"bench.{variant}", shared=False, **opts)
    def work(n: str, note: str) -> None:
        return None

    note = "x" * 200
    tag = uuid.uuid4().hex[:8]
    for i in range(warmup):
        work.delay(f"w{tag}{i}", note)
    client = redis.Redis.from_url(url, decode_responses=True)
    before = client.info("commandstats")
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(tasks):
        work.delay(f"{tag}{i}", note)
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    after = client.info("commandstats")
    script_us = sum(int(after[k]["usec"]) - int(before.get(k, {}).get("usec", 0))
                    for k in ("cmdstat_evalsha", "cmdstat_eval") if k in after)
    calls = commands_since(client, before)
    return {"us": took / tasks * 1e6, "cpu_us": cpu / tasks * 1e6,
            "redis_us": script_us / tasks, **per_task(calls, tasks)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--shards", action="store_true", help="also the sharded layout")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "URL"), help=argparse.SUPPRESS)
    common_options(ap)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.tasks, args.warmup)))
        return 0
    variants = ["plain", "unique", *(["plain16", "unique16"] if args.shards else [])]
    server = PrivateRedis(args.redis_server)
    try:
        import redis
        client = redis.Redis.from_url(server.url)
        wait_for(lambda: ping(client), 10, "the private redis-server")
        rounds = interleaved_rounds(__file__, variants, server.url, client, args.rounds,
                                    ["--tasks", str(args.tasks), "--warmup", str(args.warmup)])
    except Exception as exc:  # noqa: BLE001 - reported as a failed run
        return failed(exc)
    finally:
        server.stop()
    report: dict[str, Any] = {"tasks": args.tasks, "rounds": args.rounds,
                              "code": code_version(), "variants": {}}
    banner(78, f"unique= publish cost: {args.rounds} rounds x {args.tasks} publishes, "
               f"fresh process each", f"code: {report['code']}")
    ok = True
    for v in variants:
        base = "plain16" if v.endswith("16") else "plain"
        us = Spread.of([r[v]["us"] for r in rounds])
        ratio = Spread.of([r[v]["us"] / r[base]["us"] for r in rounds])
        cpu = Spread.of([r[v]["cpu_us"] / r[base]["cpu_us"] for r in rounds])
        rus = Spread.of([r[v]["redis_us"] for r in rounds])
        calls = rounds[-1][v]["calls"]
        extra = rounds[-1][v]["store_calls"] - rounds[-1][base]["store_calls"]
        allowed = 1 if v.endswith("16") else 0
        if v.startswith("u"):
            ok = ok and extra <= allowed + 0.01
        report["variants"][v] = {"us": us.__dict__, "ratio": ratio.__dict__,
                                 "cpu_ratio": cpu.__dict__, "redis_script_us": rus.__dict__,
                                 "store_calls": rounds[-1][v]["store_calls"], "calls": calls}
        print(f"  {v:9} {us.cell('.0f')} us/publish   x{ratio.cell('.3f')} of its plain   "
              f"store calls/publish {rounds[-1][v]['store_calls']:.2f}"
              + (f" (+{extra:.2f}, at most {allowed}: {verdict(extra <= allowed + 0.01)})"
                 if v.startswith("u") else ""))
        print(f"            publisher CPU x{cpu.cell('.3f')} of its plain; Redis time in the "
              f"store's scripts {rus.cell('.1f')} us/publish")
        print(f"            commands/publish: {calls}")
    write_json(args.json, report)
    return exit_code(ok)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
