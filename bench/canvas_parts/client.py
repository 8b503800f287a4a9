#!/usr/bin/env python
"""The client process of ``bench/canvas.py``: one per measured (round, canvas, variant), a
fresh process as a user's would be.

    canvas_parts/client.py VARIANT CANVAS N

Builds the app (``plain``: no jobbers imported; ``jobbers``: ``install(app)`` and
``base=JobbersTask``), publishes a small warm-up canvas (connections opened, scripts
loaded), builds the measured canvas (``REPEAT`` copies of it), prints ``ready`` and waits for ``go``.
It then times ``apply_async()`` of the canvases alone (building the signatures is outside: the same code in
both variants), prints one JSON line with its wall time, its own CPU and, for a jobbers app,
the records the publish made (their states), and exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

#: bench.add's signature per member; bench.tsum is the chord's callback.
CANVASES = ("group", "chunks", "starmap", "chord")
CHUNK = 100  # chunks(N, 100)
#: Publishes timed per process: a ``chunks`` or ``starmap`` of 10,000 members publishes in
#: 0.1 s or less (1 to 100 messages), too short to time alone in a fresh process; each is
#: published this many times (signatures built before the clock starts), a group or chord once.
REPEAT = {"group": 1, "chord": 1, "chunks": 10, "starmap": 40}


def _send(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def make_app(variant: str) -> tuple[Any, Any, Any, Any]:
    """(app, add, tsum, jobbers or None) of ``variant``."""
    from celery import Celery

    app = Celery("canvasbench", broker=os.environ["BENCH_BROKER_URL"],
                 backend=os.environ["BENCH_RESULT_URL"])
    app.conf.update(task_serializer="json", accept_content=["json"],
                    result_serializer="json", broker_connection_retry_on_startup=True)
    jobbers = None
    base = app.Task
    if variant != "plain":
        from jobbers_celery import JobbersTask, install

        if os.environ.get("BENCH_PUBLISH_BATCH"):
            app.conf.jobbers_publish_batch = int(os.environ["BENCH_PUBLISH_BATCH"])
        if os.environ.get("BENCH_CUT_BYTES"):  # diagnostics: 0 cuts a batch by count only
            from jobbers_celery.lifecycle import bulk

            bulk.CUT_BYTES = int(os.environ["BENCH_CUT_BYTES"]) or 1 << 62
        jobbers = install(app)
        base = JobbersTask

    @app.task(base=base, name="bench.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(base=base, name="bench.tsum", shared=False)
    def tsum(values: list[int]) -> int:
        return sum(values)

    return app, add, tsum, jobbers


def build(kind: str, n: int, add: Any, tsum: Any) -> Any:
    from celery import chord, group

    if kind == "group":
        return group(add.s(i, i) for i in range(n))
    if kind == "chunks":
        return add.chunks(zip(range(n), range(n), strict=True), CHUNK)
    if kind == "starmap":
        return add.starmap(zip(range(n), range(n), strict=True))
    if kind == "chord":
        return chord(group(add.s(i, i) for i in range(n)), tsum.s())
    raise ValueError(f"unknown canvas {kind!r}")


def messages(kind: str, n: int) -> int:
    """Broker messages ``kind`` of ``n`` members publishes."""
    return {"group": n, "chunks": -(-n // CHUNK), "starmap": 1, "chord": n}[kind]


def main(argv: list[str]) -> int:
    variant, kind, n = argv[0], argv[1], int(argv[2])
    _app, add, tsum, jobbers = make_app(variant)
    build(kind, 10, add, tsum).apply_async()  # warm-up: connections, scripts, imports
    before = _counts(jobbers)
    sigs = [build(kind, n, add, tsum) for _ in range(REPEAT[kind])]
    if kind == "chunks":
        sigs = [sig.group() for sig in sigs]  # the partition is Celery's work before any publish
    _send({"ready": True})
    if sys.stdin.readline().strip() != "go":
        return 1
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for sig in sigs:
        sig.apply_async()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    after = _counts(jobbers)
    _send({"wall": wall, "cpu": cpu, "members": n * len(sigs),
           "messages": messages(kind, n) * len(sigs),
           "records": {k: after.get(k, 0) - before.get(k, 0) for k in after
                       if after.get(k, 0) != before.get(k, 0)}})
    return 0


def _counts(jobbers: Any) -> dict[str, int]:
    if jobbers is None:
        return {}
    return {s.value: c for s, c in jobbers.counts().items() if c}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
