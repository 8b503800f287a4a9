#!/usr/bin/env python
"""What does ``self.heartbeat(progress=i)`` cost a task that calls it in a tight loop?

Issue 12, point 5: a tight loop of 100,000 ``heartbeat(progress=i)`` calls must cost under
1 us per call beyond the loop. Runs a real ``JobbersTask`` (``bench.heartbeat_loop``, in
``heartbeat_app.py``) on a real solo worker, with a private ``redis-server`` on a free
loopback port as broker (db 0, also jobbers' store) and result backend (db 1). The task body
times, ``--rounds`` times in a rotating order, three loops of ``-n`` iterations: an empty
loop, a loop calling a no-op method of the task with heartbeat()'s signature (the cost of a
method call, for scale), and the loop calling ``self.heartbeat(progress=i)``. The benchmark
runs ``--tasks`` such tasks one after the other and reports, per round, the microseconds per
call beyond the empty loop (median and min-max over every round of every task), how many
heartbeats were actually sent to Redis per loop, and checks that the last progress
(``n - 1``) reached the record at completion.

    .venv/bin/python bench/heartbeat.py              # 3 tasks x 5 rounds x 100,000 calls (~10 s)
    .venv/bin/python bench/heartbeat.py --dict       # progress={"done": i} instead of i
    .venv/bin/python bench/heartbeat.py --tasks 5 --rounds 9 --json out.json

Exit code 0 if the median is under the target, 2 if not, 1 if the benchmark failed (the
worker died, a task failed, the record did not end ``completed`` with the last progress).
See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from _common import (  # bench/ is on sys.path (the script's directory)
    PrivateRedis,
    Spread,
    Worker,
    common_options,
    exit_code,
    on_sys_path,
    ping,
    subprocess_env,
    verdict,
    wait_for,
)

TARGET_US = 1.0


def _stat(values: list[float]) -> str:
    return Spread.of(values).cell(".3f", "6.3f")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100_000, help="calls per loop (100000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the 3 loops per task (5)")
    ap.add_argument("--tasks", type=int, default=3, help="tasks, one after the other (3)")
    ap.add_argument("--dict", action="store_true", help='progress={"done": i} instead of i')
    common_options(ap, json_help="write every figure to PATH")
    args = ap.parse_args()
    if args.n < 1 or args.rounds < 1 or args.tasks < 1:
        ap.error("-n, --rounds and --tasks must be at least 1")

    work = Path(tempfile.mkdtemp(prefix="jobbers-bench-hb-"))
    redis_srv = PrivateRedis(args.redis_server)
    port = redis_srv.port
    worker: Worker | None = None
    try:
        ready = work / "ready"
        env = subprocess_env(BENCH_BROKER_URL=f"redis://127.0.0.1:{port}/0",
                             BENCH_RESULT_URL=f"redis://127.0.0.1:{port}/1",
                             BENCH_READY_FILE=str(ready))
        os.environ.update({k: env[k] for k in ("BENCH_BROKER_URL", "BENCH_RESULT_URL")})
        on_sys_path()
        import heartbeat_app  # the client side: publishes, reads results and records

        wait_for(lambda: ping(heartbeat_app.jobbers.store.client), 10, "redis-server")
        worker = Worker("heartbeat_app", "solo", 1, env, work / "worker.log", ready,
                        name=f"bench-hb-{os.getpid()}@localhost")
        worker.wait_ready()
        label = '{"done": i}' if args.dict else "i"
        print(f"heartbeat(progress={label}): {args.tasks} "
              f"tasks x {args.rounds} rounds x {args.n:,} calls, solo worker; load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        beyond: dict[str, list[float]] = {"noop": [], "heartbeat": [], "hb_vs_noop": []}
        loops_us: dict[str, list[float]] = {"empty": [], "noop": [], "heartbeat": []}
        sends: list[int] = []
        failures: list[str] = []
        per_task = []
        for t in range(args.tasks):
            res = heartbeat_app.heartbeat_loop.delay(args.n, args.rounds, args.dict)
            out = res.get(timeout=max(120.0, args.n * args.rounds * 1e-4))
            expected: Any = {"done": args.n - 1} if args.dict else args.n - 1

            def completed(task_id: str = res.id) -> Any:
                if worker is not None:
                    worker.check_alive()
                record = heartbeat_app.jobbers.get(task_id)
                return record if record is not None and record.state == "completed" else None

            record = wait_for(completed, 30, f"task {res.id} to be recorded completed")
            times = out["times"]
            for name in loops_us:
                loops_us[name] += [1e6 * x / args.n for x in times[name]]
            for e, o, h in zip(times["empty"], times["noop"], times["heartbeat"], strict=True):
                beyond["noop"].append(1e6 * (o - e) / args.n)
                beyond["heartbeat"].append(1e6 * (h - e) / args.n)
                beyond["hb_vs_noop"].append(1e6 * (h - o) / args.n)
            sends += out["sends_per_loop"]
            ok = record.progress == expected
            if not ok:
                failures.append(f"task {t + 1}: the record's progress is {record.progress!r}, "
                                f"not the last one passed ({expected!r})")
            mine = [1e6 * (h - e) / args.n
                    for e, h in zip(times["empty"], times["heartbeat"], strict=True)]
            print(f"  task {t + 1}: heartbeat beyond the loop {_stat(mine)} us/call; sent to "
                  f"Redis per loop {out['sends_per_loop']} ({out['sent']['delivered']} "
                  f"delivered); record completed, progress {record.progress!r} "
                  f"({'the last one' if ok else 'NOT the last one'})", flush=True)
            per_task.append({"times": times, "sends_per_loop": out["sends_per_loop"],
                             "sent": out["sent"], "progress": record.progress, "ok": ok})
    finally:
        if worker is not None:
            worker.stop()
        redis_srv.stop()
        shutil.rmtree(work, ignore_errors=True)

    med = statistics.median(beyond["heartbeat"])
    print(f"\nper call, median [min-max] over {len(beyond['heartbeat'])} rounds:")
    print(f"  empty loop, per iteration          {_stat(loops_us['empty'])} us")
    print(f"  no-op method call, beyond the loop {_stat(beyond['noop'])} us")
    print(f"  heartbeat(), beyond the loop       {_stat(beyond['heartbeat'])} us")
    print(f"  heartbeat(), beyond a no-op call   {_stat(beyond['hb_vs_noop'])} us")
    print(f"  heartbeats sent to Redis per loop of {args.n:,}: {sends} "
          f"(the first call of a task sends, then at most one a second)")
    print(f"target: under {TARGET_US:g} us per call beyond the loop: "
          f"{verdict(med < TARGET_US)} "
          f"(median {med:.3f} us)")
    for f in failures:
        print(f"FAILED: {f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "n": args.n, "rounds": args.rounds, "dict": args.dict, "tasks": per_task,
            "beyond_us": beyond, "loops_us": loops_us, "median_us": med}, indent=1))
    if failures:
        return 1
    return exit_code(med < TARGET_US)


if __name__ == "__main__":
    raise SystemExit(main())
