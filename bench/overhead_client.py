#!/usr/bin/env python
"""The client process of ``bench/overhead.py``: one per measured round, as a user's would be.

    overhead_client.py MODULE TASKS SERIAL

Imports the app module (``bench_plain`` or ``bench_app``), prints ``ready`` and waits for a
line on stdin. On ``go`` it publishes TASKS no-op tasks with ``.delay()`` in a loop, then
``.get()``s every result, and prints one JSON line with its own timings, CPU (its whole
process, ``time.process_time``) and Redis requests. On the next line (``serial``) it runs
SERIAL tasks one at a time (publish, ``.get()``) and prints their latencies, then, for a
jobbers app, the record counts (every task must have ended ``completed``), and exits.
The orchestrator reads every other process's CPU around the ``go`` phase.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from typing import Any


def _send(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    module, n, serial = argv[0], int(argv[1]), int(argv[2])
    mod = importlib.import_module(module)
    import bench_hooks

    task = mod.noop
    timeout = max(120.0, n / 10)
    _send({"ready": True})
    if sys.stdin.readline().strip() != "go":
        return 1
    rt0 = bench_hooks.round_trips()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    results = [task.delay() for _ in range(n)]
    t_pub = time.perf_counter()
    cpu_pub = time.process_time()
    rt_pub = bench_hooks.round_trips()
    for r in results:
        r.get(timeout=timeout)
    t1 = time.perf_counter()
    cpu1 = time.process_time()
    _send({"tasks": n, "elapsed": t1 - t0, "publish_s": t_pub - t0,
           "cpu": cpu1 - cpu0, "cpu_publish": cpu_pub - cpu0,
           "round_trips": bench_hooks.round_trips() - rt0, "round_trips_publish": rt_pub - rt0})
    del results
    if sys.stdin.readline().strip() != "serial":
        return 1
    latencies = []
    for _ in range(serial):
        s = time.perf_counter()
        task.delay().get(timeout=60)
        latencies.append(time.perf_counter() - s)
    out: dict[str, Any] = {"latencies": latencies}
    if mod.jobbers is not None and getattr(mod, "TRACKED", True):
        out["counts"] = {s.value: c for s, c in mod.jobbers.counts().items() if c}
        out["refused"] = mod.jobbers.store.refused_counts()
    _send(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
