"""Instrumentation shared by the apps ``bench/overhead.py`` measures (no jobbers import here).

Imported by ``bench_plain.py`` and ``bench_app.py`` before they build their app:

- counts the Redis requests of the process (calls of redis-py's ``send_packed_command``: one
  per command sent alone, one per pipeline, ``MULTI ... EXEC`` included). Worker processes
  write their running total to ``$BENCH_COUNT_DIR/<pid>.json`` every 0.1 s (a file write
  per 0.1 s, the same in every variant), the client reads its own;
- touches ``$BENCH_READY_FILE`` when the worker is ready (``worker_ready``), so that the
  benchmark waits for it without sending anything through the broker.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from celery import signals

_round_trips = [0]
_counting = [False]
_main_pid = [0]


def round_trips() -> int:
    """Redis requests this process sent since counting was enabled (or since the fork)."""
    return _round_trips[0]


def enable_round_trip_counting() -> None:
    """Count every ``send_packed_command`` of redis-py in this process (idempotent)."""
    if _counting[0]:
        return
    _counting[0] = True
    from redis.connection import AbstractConnection

    original = AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> Any:
        _round_trips[0] += 1
        return original(self, command, check_health)  # type: ignore[no-untyped-call]

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]


def _writer(directory: str, role: str) -> None:
    pid = os.getpid()
    path = os.path.join(directory, f"{pid}.json")
    tmp = path + ".tmp"
    tick = threading.Event()
    while True:
        with open(tmp, "w") as fh:
            json.dump({"pid": pid, "role": role, "round_trips": _round_trips[0]}, fh)
        os.replace(tmp, path)
        tick.wait(0.1)


def _start_writer(role: str) -> None:
    directory = os.environ.get("BENCH_COUNT_DIR")
    if not directory:
        return
    threading.Thread(target=_writer, args=(directory, role), name="bench-rtt",
                     daemon=True).start()


@signals.worker_init.connect
def _worker_main_init(**_: Any) -> None:
    _main_pid[0] = os.getpid()
    _start_writer("worker-main")


@signals.worker_process_init.connect
def _pool_child_init(**_: Any) -> None:
    if os.getpid() == _main_pid[0]:
        return  # the solo pool runs tasks in the main process, which counts already
    _round_trips[0] = 0  # the fork copied the main process's count
    _start_writer("worker-child")


@signals.worker_ready.connect
def _worker_ready(**_: Any) -> None:
    path = os.environ.get("BENCH_READY_FILE")
    if path:
        Path(path).write_text(str(os.getpid()))


enable_round_trip_counting()
