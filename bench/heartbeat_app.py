"""The jobbers app that ``bench/heartbeat.py`` runs (``celery -A heartbeat_app worker -P solo``).

One ``JobbersTask``, ``bench.heartbeat_loop``, whose body times tight loops of
``self.heartbeat(...)`` against the same loops with no call and with a call of a no-op method
of the task, and returns the timings with the number of heartbeats actually sent to Redis.

Environment (set by ``heartbeat.py``; benchmark scaffolding, not library code):

``BENCH_BROKER_URL``
    broker (Redis db 0), also jobbers' store.
``BENCH_RESULT_URL``
    Celery's result backend (Redis db 1).
``BENCH_READY_FILE``
    touched when the worker is ready (``worker_ready``), so that the benchmark waits for it
    without sending anything through the broker.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals

from jobbers_celery import JobbersTask, install

app = Celery("bench_heartbeat", broker=os.environ["BENCH_BROKER_URL"],
             backend=os.environ["BENCH_RESULT_URL"])
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
jobbers = install(app)

#: Heartbeats sent to Redis by this process: calls of the store's ``heartbeat`` (one Redis
#: round trip each), and of them those Redis answered.
SENT = {"calls": 0, "delivered": 0}


def _count_sends(store: Any) -> None:
    original = store.heartbeat

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        SENT["calls"] += 1
        result = original(*args, **kwargs)
        SENT["delivered"] += bool(result.delivered)
        return result

    store.heartbeat = counted


_count_sends(jobbers.store)


@signals.worker_ready.connect
def _worker_ready(**_: Any) -> None:
    path = os.environ.get("BENCH_READY_FILE")
    if path:
        Path(path).write_text(str(os.getpid()))


class LoopTask(JobbersTask):
    def noop(self, progress: Any = None, checkpoint: Any = None) -> None:
        """A method with heartbeat()'s signature that does nothing: the cost of a call."""


def _timed(loop: Any, n: int) -> float:
    t0 = time.perf_counter()
    loop(n)
    return time.perf_counter() - t0


@app.task(base=LoopTask, bind=True, name="bench.heartbeat_loop")
def heartbeat_loop(self: LoopTask, n: int, repeats: int, dict_progress: bool) -> dict[str, Any]:
    """``repeats`` rounds of: an empty loop, a loop calling ``self.noop(progress=i)`` and a
    loop calling ``self.heartbeat(progress=i)``, ``n`` iterations each (the three in a
    rotating order); with ``dict_progress`` the same three with ``progress={"done": i}``.
    The last call of the last heartbeat loop passes ``n - 1`` (or ``{"done": n - 1}``)."""

    def empty(k: int) -> None:
        for _i in range(k):
            pass

    def noop(k: int) -> None:
        for i in range(k):
            self.noop(progress=i)

    def beat(k: int) -> None:
        for i in range(k):
            self.heartbeat(progress=i)

    def empty_dict(k: int) -> None:
        for i in range(k):
            {"done": i}  # noqa: B018 - the dict built, as in the heartbeat loop

    def noop_dict(k: int) -> None:
        for i in range(k):
            self.noop(progress={"done": i})

    def beat_dict(k: int) -> None:
        for i in range(k):
            self.heartbeat(progress={"done": i})

    loops = {"empty": empty, "noop": noop, "heartbeat": beat}
    if dict_progress:
        loops = {"empty": empty_dict, "noop": noop_dict, "heartbeat": beat_dict}
    names = list(loops)
    times: dict[str, list[float]] = {name: [] for name in names}
    sends: list[int] = []
    start = dict(SENT)
    for rnd in range(repeats):
        order = names[rnd % 3:] + names[:rnd % 3]
        if rnd == repeats - 1:  # the heartbeat loop last: its last call is the last one
            order = [name for name in order if name != "heartbeat"] + ["heartbeat"]
        for name in order:
            before = SENT["calls"]
            times[name].append(_timed(loops[name], n))
            if name == "heartbeat":
                sends.append(SENT["calls"] - before)
    return {"times": times, "sends_per_loop": sends,
            "sent": {k: v - start[k] for k, v in SENT.items()}, "pid": os.getpid()}
