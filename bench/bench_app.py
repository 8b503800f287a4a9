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
``BENCH_STORE_MODE``
    diagnostics only, to split the jobbers overhead into its parts: ``real`` (default);
    ``trivial-lua``: each step still sends its EVALSHA with the same keys and arguments,
    but to a script that returns at once (round trip without the Lua work; the completion's
    script still writes Celery's result); ``noop``: no Redis call at all (only the Python
    side of jobbers; Celery's backend stores the result as for a plain task). Records are
    not written in these modes.
``BENCH_PROFILE_DIR``
    when set, every prefork pool child runs under cProfile. Once ``<dir>/reset`` exists
    (end of warmup) it starts afresh and then writes ``<dir>/child-<pid>.prof`` (and the
    number of tasks it covers, ``child-<pid>.json``) every ``BENCH_PROFILE_EVERY`` tasks.
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


# --------------------------------------------------------------------------- store modes
STORE_MODE = os.environ.get("BENCH_STORE_MODE", "real")


def _fake_reply(args: list[Any]) -> list[Any]:
    spec = json.loads(args[1])
    previous = spec["from"][0] if spec.get("from") else "missing"
    return [1, previous, 0, int(spec.get("fence") or 1), spec["to"],
            *([""] * len(spec.get("ret", ())))]


if STORE_MODE == "noop":
    from jobbers_celery import results as _results

    def _noop_transition(keys: list[str], args: list[Any]) -> list[Any]:
        return _fake_reply(args)

    jobbers.store._transition = _noop_transition  # type: ignore[assignment]
    # No jobbers call at all: Celery's backend stores the result as for a plain task.
    _results.folded_result = lambda *_: None  # type: ignore[assignment]
elif STORE_MODE == "trivial-lua":
    from jobbers_celery.store.fastcall import FastScript

    _client = jobbers.store.client
    _trivial = FastScript(_client, _client.register_script("return {1, 'x', 0, 1}"))
    # The completion still writes Celery's result (its last key; ARGV[3] value, ARGV[4] ttl).
    _trivial_complete = FastScript(_client, _client.register_script(
        "local k = KEYS[#KEYS]\n"
        "if tonumber(ARGV[4]) > 0 then redis.call('SET', k, ARGV[3], 'EX', ARGV[4])\n"
        "else redis.call('SET', k, ARGV[3]) end\n"
        "redis.call('PUBLISH', k, ARGV[3])\n"
        "return {1, 'x', 0, 1}"))

    def _trivial_transition(keys: list[str], args: list[Any]) -> list[Any]:
        _trivial(keys, args)
        return _fake_reply(args)

    def _trivial_completion(keys: list[str], args: list[Any]) -> list[Any]:
        _trivial_complete(keys, args)
        return _fake_reply(args)

    jobbers.store._transition = _trivial_transition  # type: ignore[assignment]
    jobbers.store._complete = _trivial_completion  # type: ignore[assignment]
elif STORE_MODE != "real":
    raise ValueError(f"BENCH_STORE_MODE must be real, trivial-lua or noop, not {STORE_MODE!r}")


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
        return original(self, command, check_health)  # type: ignore[no-untyped-call]

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
        base = os.path.join(directory, f"child-{os.getpid()}")
        _profile.update(every=int(os.environ.get("BENCH_PROFILE_EVERY", "50")),
                        path=base + ".prof", meta=base + ".json",
                        reset=os.path.join(directory, "reset"), reset_seen=False)
        _reset_profile()


def _reset_profile() -> None:
    if "profiler" in _profile:
        _profile["profiler"].disable()
    _profile.update(profiler=cProfile.Profile(), n=0)
    _profile["profiler"].enable()


@signals.task_postrun.connect
def _dump_profile(**_: Any) -> None:
    """Dump every few tasks; start afresh once ``<dir>/reset`` appears (end of warmup)."""
    if not _profile:
        return
    if not _profile["reset_seen"] and os.path.exists(_profile["reset"]):
        _profile["reset_seen"] = True
        _reset_profile()
        return
    _profile["n"] += 1
    if _profile["reset_seen"] and _profile["n"] % _profile["every"] == 0:
        profiler = _profile["profiler"]
        profiler.disable()
        profiler.dump_stats(_profile["path"])
        with open(_profile["meta"], "w") as fh:
            json.dump({"tasks": _profile["n"]}, fh)
        profiler.enable()
