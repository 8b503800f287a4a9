"""The Celery app of the unique-task tests (``celery -A tests.integration.unique_proj``):
broker, result backend and state store on ``JOBBERS_TEST_REDIS_URL``, one shard unless
``UNIQUE_PROJ_SHARDS`` says otherwise; the state store on ``UNIQUE_PROJ_STORE`` if set (a Redis
Cluster node: test_on_cluster.py). Each task's body appends its key to the Redis list
``<key>:ran`` (so a test counts the runs), then sleeps while ``<key>:hold`` exists."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from jobbers_celery import JobbersTask, install
from jobbers_celery.core.unique import Unique, Until

URL = os.environ["JOBBERS_TEST_REDIS_URL"]

app = Celery("unique_proj", broker=URL, backend=URL, set_as_current=False)
app.conf.update(
    task_serializer="json", accept_content=["json"], result_serializer="json",
    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
    jobbers_redis_url=os.environ.get("UNIQUE_PROJ_STORE") or URL,
    jobbers_scheduler_interval=0.2,
    jobbers_store_shards=int(os.environ.get("UNIQUE_PROJ_SHARDS", "1")),
    jobbers_key_prefix=os.environ.get("UNIQUE_PROJ_PREFIX", "jobbers"),
    jobbers_worker_lost_after=3, jobbers_cleaner_interval=1,
)
jobbers = install(app)
_client = redis.Redis.from_url(URL)


def _body(key: str) -> str:
    _client.rpush(f"{key}:ran", key)
    deadline = time.monotonic() + 60
    while _client.exists(f"{key}:hold") and time.monotonic() < deadline:
        time.sleep(0.05)
    return key


@app.task(base=JobbersTask, name="uq.end", unique=Unique(on=(0,)), shared=False)
def until_end(key: str, note: str = "") -> str:
    return _body(key)


@app.task(base=JobbersTask, name="uq.start", unique=Unique(on=(0,), until=Until.START),
          shared=False)
def until_start(key: str) -> str:
    return _body(key)


#: The window of ``uq.window``: test_unique checks that a duplicate publish is refused after
#: the copy completed, so it outlasts a run and its polls on a loaded machine by far.
WINDOW_TTL_S = 5.0


@app.task(base=JobbersTask, name="uq.window",
          unique=Unique(on=(0,), until=Until.WINDOW, ttl=WINDOW_TTL_S), shared=False)
def window(key: str) -> str:
    return _body(key)


@app.task(base=JobbersTask, name="uq.raising",
          unique=Unique(key=lambda a, k: str(k["account"]), raise_duplicate=True),
          shared=False)
def raising(account: str, payload: str = "") -> str:
    return _body(account)


@app.task(base=JobbersTask, name="uq.count", shared=False)
def count(values: list[str]) -> int:
    """A chord's callback, or a chain's later link: not unique."""
    return len(values) if isinstance(values, list) else 1
