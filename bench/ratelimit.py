#!/usr/bin/env python
"""What does ``rate_limit_by=`` cost a start? (docs/howto/rate-limits.md)

On a private ``redis-server``, a fresh process per variant and round records ``--tasks``
submissions, then times their start steps (the worker's ``Starter`` path: the key's digest
from the arguments, then ``store.start``), and counts the Redis commands the starts sent
(``INFO commandstats`` before and after: the store's round trips are its script calls,
``evalsha``). Variants, interleaved round by round (A B, B A, ...):

- ``plain``: a start without a limit;
- ``limited``: the same start with ``RateLimit("100000/s", on="account")`` over 50 keys
  (every start admitted: the cost of the check and of recording the start in the window);
- ``plain16``, ``limited16`` (``--shards``): the same on the sharded layout (16 shards),
  where the window lives in the global slot and is asked by one call before the step.

Target: a limited start costs no store call more than a plain one on one Redis, at most one
on the sharded layout; the time ratio is reported (median [min-max] of the rounds).

    .venv/bin/python bench/ratelimit.py                 # 6 rounds of 2,000 starts
    .venv/bin/python bench/ratelimit.py --rounds 4 --tasks 1000 --shards --json out.json
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

#: The store's round trips: its script calls (the commands a script runs are no round trip).
STORE_COMMANDS = ("evalsha", "eval")
NAME = "bench.call"


def child(variant: str, url: str, tasks: int, warmup: int) -> dict[str, Any]:
    """One variant's starts in this (fresh) process; what the parent prints."""
    import redis

    from jobbers_celery.core.ratelimit import RateKey, RateLimit
    from jobbers_celery.core.states import TaskState
    from jobbers_celery.store import RedisStore

    shards = 16 if variant.endswith("16") else 1
    store = RedisStore.from_url(url, prefix=f"b{shards}", shards=shards)
    limit = RateLimit("100000/s", on="account") if variant.startswith("l") else None

    def call(account: str, n: int) -> None: ...

    tag = uuid.uuid4().hex[:8]
    ids = [f"{tag}-{i}" for i in range(warmup + tasks)]
    for task_id in ids:
        store.step(task_id, TaskState.SUBMITTED, sources=(TaskState.UNSUBMITTED,),
                   create={"name": NAME, "queue": "q", "ver": "1"}, reason="published",
                   name=NAME, set_fields={"msg": '{"args": [], "kwargs": {}}'})

    def start(i: int, task_id: str) -> None:
        rate = None
        if limit is not None:  # what the worker's Starter does with the call's arguments
            rate = RateKey(limit.digest(call, (f"acct-{i % 50}", i), {}), limit.limit)
        res = store.start(task_id, name=NAME, worker="w@h", wid="wid-1", heartbeat_ms=None,
                          cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={}, rate=rate)
        assert res.state is TaskState.STARTED, res

    for i, task_id in enumerate(ids[:warmup]):
        start(i, task_id)
    client = redis.Redis.from_url(url, decode_responses=True)
    before = client.info("commandstats")
    started = time.perf_counter()
    for i, task_id in enumerate(ids[warmup:]):
        start(i, task_id)
    took = time.perf_counter() - started
    return {"us": took / tasks * 1e6, **per_task(commands_since(client, before), tasks)}


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
    variants = ["plain", "limited", *(["plain16", "limited16"] if args.shards else [])]
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
    banner(78, f"rate_limit_by= start cost: {args.rounds} rounds x {args.tasks} starts, "
               f"fresh process each", f"code: {report['code']}")
    ok = True
    for v in variants:
        base = "plain16" if v.endswith("16") else "plain"
        us = Spread.of([r[v]["us"] for r in rounds])
        ratio = Spread.of([r[v]["us"] / r[base]["us"] for r in rounds])
        calls = rounds[-1][v]["calls"]
        extra = rounds[-1][v]["store_calls"] - rounds[-1][base]["store_calls"]
        allowed = 1 if v.endswith("16") else 0
        if v.startswith("l"):
            ok = ok and extra <= allowed + 0.01
        report["variants"][v] = {"us": us.__dict__, "ratio": ratio.__dict__,
                                 "store_calls": rounds[-1][v]["store_calls"], "calls": calls}
        print(f"  {v:9} {us.cell('.0f')} us/start   x{ratio.cell('.3f')} of its plain   "
              f"store calls/start {rounds[-1][v]['store_calls']:.2f}"
              + (f" (+{extra:.2f}, at most {allowed}: {verdict(extra <= allowed + 0.01)})"
                 if v.startswith("l") else ""))
        print(f"            commands/start: {calls}")
    write_json(args.json, report)
    return exit_code(ok)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
