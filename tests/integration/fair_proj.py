"""The Celery app of the fair-share tests (``celery -A tests.integration.fair_proj``):
``fair.work`` runs at most 2 at once per tenant (``concurrency_key="tenant"``) and counts, in
Redis, how many of each tenant's bodies run at once (``<key>:<tenant>:now``, the most seen
in ``<key>:<tenant>:max``); ``fair.item`` (the same key) and ``fair.gather`` make a chord.
``FAIR_SHARDS``: the store's shards (1 unless given)."""

from __future__ import annotations

import os
import time
from typing import Any

from jobbers_celery import JobbersTask, install
from tests.testapp import make_app

REDIS_URL = os.environ["JOBBERS_TEST_REDIS_URL"]

app = make_app("fair_proj", REDIS_URL, jobbers_key_prefix="fair",
               jobbers_store_shards=int(os.environ.get("FAIR_SHARDS", "1")),
               jobbers_worker_lost_after=3)
jobbers = install(app)

_client: Any = None


def _redis() -> Any:
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    return _client


@app.task(base=JobbersTask, name="fair.work", shared=False, max_concurrent=2,
          concurrency_key="tenant")
def work(key: str, tenant: str, seconds: float) -> int:
    """Counts how many of ``tenant``'s run at once; its id joins ``<key>:done``."""
    r = _redis()
    now = int(r.incr(f"{key}:{tenant}:now"))
    r.eval("if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
           "redis.call('SET', KEYS[1], ARGV[1]) end", 1, f"{key}:{tenant}:max", now)
    try:
        time.sleep(seconds)
    finally:
        r.decr(f"{key}:{tenant}:now")
        r.rpush(f"{key}:done", tenant)
    return now


@app.task(base=JobbersTask, name="fair.item", shared=False, max_concurrent=2,
          concurrency_key="tenant")
def item(key: str, tenant: str, n: int) -> int:
    """A keyed chord member: returns ``n``."""
    _redis().rpush(f"{key}:items", n)
    return n


@app.task(base=JobbersTask, name="fair.gather", shared=False)
def gather(values: list[int], key: str) -> None:
    """A chord's callback: its results, sorted, in ``<key>:gathered``."""
    _redis().rpush(f"{key}:gathered", *sorted(values))


@app.task(base=JobbersTask, name="fair.link", shared=False, max_concurrent=2,
          concurrency_key="tenant")
def link(prev: int, key: str, tenant: str, seconds: float) -> int:
    """A chain's link: ``fair.work``'s body, returns ``prev + 1``."""
    work(key, tenant, seconds)
    return prev + 1
