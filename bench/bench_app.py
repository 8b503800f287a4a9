"""The Celery app that ``bench/overhead.py`` measures (``celery -A bench_app worker``).

One app, Redis broker and Redis result backend on the same (private) server, jobbers
installed, and two tasks that do nothing: a plain Celery task and a ``JobbersTask``. Any
difference between the two is what jobbers costs.

Environment (set by ``overhead.py``; this module is benchmark scaffolding, not library code):

``BENCH_REDIS_URL``
    broker, result backend and jobbers store (required).
``BENCH_COUNT_DIR``
    when set, every worker process counts its Redis round trips (calls of redis-py's
    ``send_packed_command``: one per command sent alone, one per pipeline) and writes the
    running total to ``<dir>/<pid>.json`` a few times a second.
``BENCH_PROFILE_DIR``
    when set, every prefork pool child runs under cProfile and writes
    ``<dir>/child-<pid>.prof`` every ``BENCH_PROFILE_EVERY`` tasks (default 200).
"""

from __future__ import annotations

import cProfile
import json
import os
import threading
from typing import Any

from celery import Celery, signals

from jobbers_celery import JobbersTask, install

REDIS_URL = os.environ["BENCH_REDIS_URL"]

app = Celery("bench", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
jobbers = install(app)


@app.task(name="bench.plain_noop")
def plain_noop() -> None:
    return None


@app.task(base=JobbersTask, name="bench.jobbers_noop")
def jobbers_noop() -> None:
    return None


TASKS = {"plain": plain_noop, "jobbers": jobbers_noop}


# --------------------------------------------------------------------------- round trips
_round_trips = [0]
_counting = [False]


def round_trips() -> int:
    """Redis round trips this process made since counting was enabled (or since fork)."""
    return _round_trips[0]


def enable_round_trip_counting() -> None:
    """Count every ``send_packed_command`` of redis-py in this process (idempotent).

    A pipeline is sent with one call, a lone command with one call, a health-check PING
    with one more: the count is the number of requests this process sent to Redis.
    """
    if _counting[0]:
        return
    _counting[0] = True
    from redis.connection import AbstractConnection

    original = AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> Any:
        _round_trips[0] += 1
        return original(self, command, check_health)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]


def _writer(directory: str, role: str) -> None:
    pid = os.getpid()
    path = os.path.join(directory, f"{pid}.json")
    tmp = path + ".tmp"
    while True:
        with open(tmp, "w") as fh:
            json.dump({"pid": pid, "role": role, "round_trips": _round_trips[0]}, fh)
        os.replace(tmp, path)
        threading.Event().wait(0.1)


def _start_writer(role: str) -> None:
    directory = os.environ.get("BENCH_COUNT_DIR")
    if not directory:
        return
    enable_round_trip_counting()
    threading.Thread(target=_writer, args=(directory, role), name="bench-rtt",
                     daemon=True).start()


# --------------------------------------------------------------------------- profiling
_profile: dict[str, Any] = {}


@signals.worker_init.connect
def _worker_main_init(**_: Any) -> None:
    _start_writer("worker-main")


@signals.worker_process_init.connect
def _pool_child_init(**_: Any) -> None:
    _round_trips[0] = 0  # the fork copied the main process's count
    _start_writer("worker-child")
    directory = os.environ.get("BENCH_PROFILE_DIR")
    if directory:
        profiler = cProfile.Profile()
        _profile.update(profiler=profiler, n=0,
                        every=int(os.environ.get("BENCH_PROFILE_EVERY", "200")),
                        path=os.path.join(directory, f"child-{os.getpid()}.prof"))
        profiler.enable()


@signals.task_postrun.connect
def _dump_profile(**_: Any) -> None:
    if not _profile:
        return
    _profile["n"] += 1
    if _profile["n"] % _profile["every"] == 0:
        profiler = _profile["profiler"]
        profiler.disable()
        profiler.dump_stats(_profile["path"])
        profiler.enable()
