#!/usr/bin/env python
"""Redis cost of one task's lifecycle steps, script by script (no Celery, no worker).

Runs the three steps a task that completes first time makes (``submitted`` at publish,
``started``, ``completed`` with Celery's result write folded in), and a heartbeat between the
last two, N times against a private ``redis-server``, with the same arguments the real code
sends, and prints per step: the server time (``INFO commandstats`` ``usec`` of the script call, which includes the commands
the script runs), the commands it runs by name, and the client's CPU per call. Used to find
where the Redis server time of ``overhead.py`` goes and to check a change to a script before
the (slower, noisier) end-to-end benchmark.

It also reads the ``redis-server`` process's CPU (``/proc``, user + system, so request
parsing and socket I/O count, not only the script) per step, and prints the capacity that
gives on paper: lifecycle steps, and tasks of three steps, one fully busy Redis core takes.

    .venv/bin/python bench/steps.py            # 5000 tasks
    .venv/bin/python bench/steps.py -n 20000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: jobbers

import redis
from _common import (  # bench/ is on sys.path
    PrivateRedis,
    commandstats,
    common_options,
    ping,
    proc_cpu,
    wait_for,
)

from jobbers_celery.core.states import TaskState
from jobbers_celery.store import RedisStore, ResultWrite

S = TaskState


def _delta(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
           ) -> dict[str, tuple[int, int]]:
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0:
            out[name] = (calls - c0, usec - u0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=5000, help="tasks (default 5000)")
    common_options(ap, json_help=None)
    args = ap.parse_args()
    srv = PrivateRedis(args.redis_server)
    try:
        client = redis.Redis(port=srv.port, decode_responses=True)
        wait_for(lambda: ping(client), 10, "redis-server to answer")
        store = RedisStore(redis.Redis(port=srv.port, decode_responses=True,
                                       health_check_interval=30))
        ids = [str(uuid.uuid4()) for _ in range(args.n)]
        msg = ('{"args":[],"kwargs":{},"options":{"queue":"celery","headers":{}}}')
        wid = "w1-" + uuid.uuid4().hex[:12]
        meta = ('{"status": "SUCCESS", "result": null, "traceback": null, "children": [], '
                '"date_done": "2026-11-24T05:00:00.000000+00:00", "task_id": "%s"}')

        def submit(tid: str) -> Any:
            return store.step(tid, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                              create={"name": "bench.noop", "queue": "celery"},
                              set_fields={"msg": msg}, reason="published", name="bench.noop")

        def start(tid: str) -> Any:
            return store.step(tid, S.STARTED, start=True, worker="celery@bench", wid=wid,
                              lease_cap_ms=60000, defer_ms=1000, cancellable=True,
                              set_fields={}, ret=("ckpt", "queue"), name="bench.noop")

        def heartbeat(tid: str) -> Any:  # with progress, as a long task sends it
            return store.heartbeat(tid, 1, progress='{"done": 40, "total": 100}',
                                   name="bench.noop")

        def complete(tid: str) -> Any:
            return store.step(tid, S.COMPLETED, sources=(S.STARTED,), fence=1,
                              worker="celery@bench", delete=("msg", "wid", "hb_iv", "srec"),
                              write_result=ResultWrite(key=f"celery-task-meta-{tid}",
                                                       value=meta % tid, expires=86400),
                              wid=wid, name="bench.noop", set_fields={})

        redis_per_task = 0.0
        steps = (("submitted", submit), ("started", start), ("heartbeat", heartbeat),
                 ("completed", complete))
        for label, fn in steps:
            before = commandstats(client)
            cpu0 = time.process_time()
            server0 = proc_cpu(srv.proc.pid)[0]
            for tid in ids:
                res = fn(tid)
                if not getattr(res, "applied", getattr(res, "accepted", False)):
                    raise SystemExit(f"{label} refused: {res}")
            cpu = time.process_time() - cpu0
            server_cpu = (proc_cpu(srv.proc.pid)[0] - server0) / args.n * 1e6
            if label != "heartbeat":  # per task of three steps; a heartbeat is extra
                redis_per_task += server_cpu
            d = _delta(before, commandstats(client))
            d.pop("info", None)
            script = sum(u for n, (c, u) in d.items() if n in ("evalsha", "eval"))
            inner = ", ".join(f"{n} {c / args.n:g}" for n, (c, u) in sorted(d.items())
                              if n not in ("evalsha", "eval"))
            print(f"{label:10s} server {script / args.n:6.1f} us/step (Redis process CPU "
                  f"{server_cpu:6.1f}) | client CPU {cpu / args.n * 1e6:6.1f} us/step | "
                  f"commands per step: {inner}")
        mem = client.info("memory")["used_memory"]
        print(f"records: {client.dbsize()} keys, used_memory {mem / args.n:.0f} B per task")
        print(f"capacity of one Redis core: Redis CPU {redis_per_task:.1f} us per task of three "
              f"steps -> {1e6 / redis_per_task:,.0f} tasks/s, "
              f"{3e6 / redis_per_task:,.0f} steps/s")
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
