"""The apps of the chord and starmap/chunks tests (``tests/integration/test_chords.py``).

``build(name, base, tracked)`` makes either: ``celery -A tests.integration.chord_proj`` runs
the jobbers app (members saving dead letters), ``celery -A tests.integration.chord_plain_proj``
the same tasks on plain ``celery.Task``. Each app has a queue of its own, so a worker of one
never takes the other's messages. A header member fails until the test sets its flag key in
Redis (:func:`fixed`): the condition an operator fixes before resubmitting.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import Reject

from jobbers_celery import DeadLetterPolicy

REDIS_URL = os.environ["JOBBERS_TEST_REDIS_URL"]


def fixed(key: str) -> bool:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return client.get(key) == b"fixed"
    finally:
        client.close()


def file_backend() -> str:
    """A filesystem result backend (a backend without a native chord counter: Celery joins
    chords with ``celery.chord_unlock`` polls), one directory per test Redis server."""
    port = REDIS_URL.rsplit(":", 1)[-1].split("/")[0]
    path = os.path.join(tempfile.gettempdir(), f"jobbers-chords-{port}")
    os.makedirs(path, exist_ok=True)
    return f"file://{path}"


def build(name: str, base: type[Task[Any, Any]], tracked: bool,
          backend: str | None = None) -> Celery:
    app = Celery(name, broker=REDIS_URL, backend=backend or REDIS_URL, set_as_current=False)
    app.conf.update(
        task_serializer="json", accept_content=["json"], result_serializer="json",
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
        task_default_queue=name, jobbers_scheduler_interval=0.2,
        result_chord_retry_interval=0.2,
        jobbers_worker_lost_after=3, jobbers_cleaner_interval=1,
    )
    if tracked:
        from jobbers_celery import install

        install(app)
    options: dict[str, Any] = {"dead_letter_policy": DeadLetterPolicy.SAVE} if tracked else {}

    @app.task(base=base, bind=True, name=f"{name}.member", shared=False, **options)
    def member(self: Task[Any, Any], i: int, key: str = "") -> int:
        """Returns ``i * 10``; fails while ``key`` (when given) is not fixed."""
        if key and not fixed(key):
            raise ValueError(f"member {i}: {key} is not fixed")
        return i * 10

    @app.task(base=base, bind=True, name=f"{name}.hang", shared=False,
              **options, **({"max_heartbeat_interval": 2} if tracked else {}))
    def hang(self: Task[Any, Any], i: int, key: str) -> int:
        """Hangs without a heartbeat (so it stalls) until ``key`` is fixed."""
        while not fixed(key):
            time.sleep(0.1)
        return i * 10

    @app.task(base=base, bind=True, name=f"{name}.lost", shared=False, **options)
    def lost(self: Task[Any, Any], i: int, key: str) -> int:
        """Its pool process dies (SIGKILL) until ``key`` is fixed: a lost worker."""
        if not fixed(key):
            os.kill(os.getpid(), signal.SIGKILL)
        return i * 10

    @app.task(base=base, bind=True, name=f"{name}.refuse", shared=False, **options)
    def refuse(self: Task[Any, Any], i: int, key: str) -> int:
        """Rejects its message without requeue until ``key`` is fixed."""
        if not fixed(key):
            raise Reject(f"member {i}: {key} is not fixed", requeue=False)
        return i * 10

    @app.task(base=base, bind=True, name=f"{name}.slow", shared=False, time_limit=1,
              **options)
    def slow(self: Task[Any, Any], i: int, key: str) -> int:
        """Runs past its hard time limit (1 s) until ``key`` is fixed."""
        while not fixed(key):
            time.sleep(0.1)
        return i * 10

    @app.task(base=base, bind=True, name=f"{name}.collect", shared=False, **options)
    def collect(self: Task[Any, Any], results: list[Any]) -> list[Any]:
        return results

    @app.task(base=base, bind=True, name=f"{name}.add", shared=False, **options)
    def add(self: Task[Any, Any], x: int, y: int) -> int:
        if x < 0:
            raise ValueError(f"negative: {x}")
        return x + y

    return app

