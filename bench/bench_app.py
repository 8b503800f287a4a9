"""The jobbers app that ``bench/overhead.py`` measures (``celery -A bench_app worker``).

A Celery app with jobbers installed and one no-op ``JobbersTask``, ``bench.noop``, the same
name, settings and broker as the plain app of ``bench_plain.py``.

Environment (set by ``overhead.py``; this module is benchmark scaffolding, not library code):

``BENCH_BROKER_URL``
    broker (Redis db 0); also the jobbers store unless ``BENCH_JOBBERS_URL`` is set.
``BENCH_RESULT_URL``
    Celery's result backend (Redis db 1).
``BENCH_JOBBERS_URL``
    ``jobbers_redis_url``; set to the result backend's URL, jobbers folds Celery's result
    write into its ``completed`` step ("folded" variant).
``BENCH_PLAIN_TASK``
    ``1``: ``bench.noop`` is a plain task (variant ``plain_installed``).
``BENCH_SHARDS``
    ``jobbers_store_shards`` (variant ``jobbers_sharded``: 16, where one server's default is
    one), under its own ``BENCH_KEY_PREFIX`` (``jobbers_key_prefix``) so that the two
    layouts never meet in one dataset.
``BENCH_STORE_MODE``
    diagnostics only, to split the jobbers overhead into its parts: ``real`` (default);
    ``trivial-lua``: each step still sends its EVALSHA with the same keys and arguments,
    but to a script that returns at once (round trip without the Lua work; the completion's
    script still writes Celery's result); ``noop``: no Redis call at all (only the Python
    side of jobbers; Celery's backend stores the result as for a plain task). Records are
    not written in these modes.
"""

from __future__ import annotations

import json
import os
from typing import Any

import bench_hooks  # noqa: F401 - counts Redis requests, signals readiness
from celery import Celery

from jobbers_celery import JobbersTask, install

app = Celery("bench", broker=os.environ["BENCH_BROKER_URL"],
             backend=os.environ["BENCH_RESULT_URL"])
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get("BENCH_JOBBERS_URL"):
    app.conf.jobbers_redis_url = os.environ["BENCH_JOBBERS_URL"]
if os.environ.get("BENCH_SHARDS"):
    app.conf.jobbers_store_shards = int(os.environ["BENCH_SHARDS"])
    app.conf.jobbers_key_prefix = os.environ["BENCH_KEY_PREFIX"]
jobbers = install(app)


#: ``BENCH_PLAIN_TASK=1``: ``bench.noop`` is a plain task of this app (jobbers installed but
#: not used by the task: the baseline of the previous overhead.py, variant plain_installed).
TRACKED = os.environ.get("BENCH_PLAIN_TASK") != "1"


@app.task(base=JobbersTask if TRACKED else app.Task, name="bench.noop")
def noop() -> None:
    return None


# --------------------------------------------------------------------------- store modes
STORE_MODE = os.environ.get("BENCH_STORE_MODE", "real")


def _fake_reply(args: list[Any]) -> list[Any]:
    spec = json.loads(args[1])
    previous = spec["from"][0] if spec.get("from") else "missing"
    return [1, previous, 0, int(spec.get("fence") or 1), spec["to"],
            *([""] * len(spec.get("ret", ())))]


if STORE_MODE == "noop":
    from jobbers_celery.lifecycle import results as _results

    def _noop_transition(keys: list[str], args: list[Any]) -> list[Any]:
        return _fake_reply(args)

    jobbers.store._transition = _noop_transition  # type: ignore[assignment]
    # No jobbers call at all: Celery's backend stores the result as for a plain task.
    _results.folded_result = lambda *_: None
elif STORE_MODE == "trivial-lua":
    from jobbers_celery.store.fastcall import FastScript

    _client = jobbers.store.client
    _trivial = FastScript(_client, _client.register_script("return {1, 'x', 0, 1}"))
    # The completion still writes Celery's result (its last key; ARGV[3] value, ARGV[4] ttl).
    _trivial_complete = FastScript(_client, _client.register_script(
        "local k = KEYS[#KEYS]\n"
        "if ARGV[5] ~= '' then redis.call('SELECT', ARGV[5]) end\n"
        "if tonumber(ARGV[4]) > 0 then redis.call('SET', k, ARGV[3], 'EX', ARGV[4])\n"
        "else redis.call('SET', k, ARGV[3]) end\n"
        "redis.call('PUBLISH', k, ARGV[3])\n"
        "return {1, 'x', 0, 1}"))

    def _trivial_transition(keys: list[str], args: list[Any]) -> list[Any]:
        _trivial(keys, args)
        return _fake_reply(args)

    def _trivial_completion(keys: list[str], args: list[Any]) -> list[Any]:
        _trivial_complete(keys, args)
        return [*_fake_reply(args), 1]  # 1: the result was written

    jobbers.store._transition = _trivial_transition  # type: ignore[assignment]
    jobbers.store._complete = _trivial_completion  # type: ignore[assignment]
elif STORE_MODE != "real":
    raise ValueError(f"BENCH_STORE_MODE must be real, trivial-lua or noop, not {STORE_MODE!r}")
