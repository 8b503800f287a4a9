"""Plain Celery, as a project without jobbers has it (``celery -A bench_plain worker``).

This module must never import jobbers: the baseline of ``bench/overhead.py`` pays nothing
of it (no signal handlers, no worker steps, no liveness thread).

Environment (set by ``overhead.py``): ``BENCH_BROKER_URL`` (Redis db 0),
``BENCH_RESULT_URL`` (Redis db 1), ``BENCH_TRACK_STARTED`` (``1``: ``task_track_started``,
one more result-backend write per task, the ``STARTED`` state).
"""

from __future__ import annotations

import os

import bench_hooks  # noqa: F401 - counts Redis requests, signals readiness
from celery import Celery

app = Celery("bench", broker=os.environ["BENCH_BROKER_URL"],
             backend=os.environ["BENCH_RESULT_URL"])
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_track_started=os.environ.get("BENCH_TRACK_STARTED") == "1",
)


@app.task(name="bench.noop")
def noop() -> None:
    return None


jobbers = None
