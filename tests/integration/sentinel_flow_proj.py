"""The Celery app of the flow-control tests on Sentinel (``celery -A
tests.integration.sentinel_flow_proj``): the state store on the Sentinel set
``SENTINEL_FLOW_STORE`` (kombu's ``sentinel://`` form, master ``SENTINEL_FLOW_MASTER``,
keys under ``SENTINEL_FLOW_PREFIX``), broker and results on the plain Redis
``SENTINEL_FLOW_BROKER``, which no failover touches: what a test sees of a failover is the
store's doing, not kombu's. The test process builds the same app with :func:`build`.

The bodies leave their marks in the broker's Redis too (read without the store, and kept
across a failover): ``sf.once`` (unique on its first argument) appends its id to
``<key>:ran`` and waits while ``<key>:hold`` exists; ``sf.call`` (4 starts a second per
``account``) appends ``<id> <start time>`` to ``<account>:starts``; ``sf.fair`` (2 at once per
``tenant``) counts its tenant's bodies running at once (``<key>:<tenant>:now``, the most in
``<key>:<tenant>:max``) and appends ``<tenant> <id> <start> <end>`` to ``<key>:spans``.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from jobbers_celery import JobbersTask, RateLimit, Unique, install
from tests.testapp import make_app

RATE = "4/s"
CAP = 2

#: Raises ``KEYS[1]`` to ``ARGV[1]`` if it is lower: one call, so two bodies ending their
#: count at once cannot both miss the other's.
_RAISE_MAX = ("if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
              "redis.call('SET', KEYS[1], ARGV[1]) end")


def build(store: str, master: str, broker: str, prefix: str) -> Celery:
    """The app: jobbers' store on the Sentinel set ``store`` (master ``master``), broker and
    results on ``broker``, one shard (the layout a plain Redis gets)."""
    app = make_app("sentinel_flow_proj", store, broker=broker, backend=broker,
                   jobbers_redis_transport_options={"master_name": master},
                   jobbers_store_shards=None, jobbers_key_prefix=prefix,
                   jobbers_scheduler_interval=0.05, jobbers_worker_lost_after=5)
    install(app)
    marks = redis.Redis.from_url(broker, decode_responses=True)

    @app.task(base=JobbersTask, bind=True, name="sf.once", unique=Unique(on=(0,)),
              shared=False)
    def once(self: JobbersTask, key: str) -> str:
        marks.rpush(f"{key}:ran", str(self.request.id))
        deadline = time.monotonic() + 60
        while marks.exists(f"{key}:hold") and time.monotonic() < deadline:
            time.sleep(0.05)
        return key

    @app.task(base=JobbersTask, bind=True, name="sf.call",
              rate_limit_by=RateLimit(RATE, on="account"), shared=False)
    def call(self: JobbersTask, account: str, n: int) -> int:
        marks.rpush(f"{account}:starts", f"{self.request.id} {time.time():.6f}")
        return n

    @app.task(base=JobbersTask, bind=True, name="sf.fair", shared=False,
              max_concurrent=CAP, concurrency_key="tenant")
    def fair(self: JobbersTask, key: str, tenant: str, seconds: float) -> int:
        started = time.time()
        now = int(marks.incr(f"{key}:{tenant}:now"))
        marks.eval(_RAISE_MAX, 1, f"{key}:{tenant}:max", now)
        try:
            time.sleep(seconds)
        finally:
            marks.decr(f"{key}:{tenant}:now")
            marks.rpush(f"{key}:spans",
                        f"{tenant} {self.request.id} {started:.6f} {time.time():.6f}")
        return now

    return app


if "SENTINEL_FLOW_STORE" in os.environ:  # a worker's (the tests call build() themselves)
    app = build(os.environ["SENTINEL_FLOW_STORE"], os.environ["SENTINEL_FLOW_MASTER"],
                os.environ["SENTINEL_FLOW_BROKER"], os.environ["SENTINEL_FLOW_PREFIX"])
