"""A small Celery app with jobbers installed: the tasks the demo submits.

The Redis URL comes from the ``DEMO_REDIS_URL`` environment variable, which the demo
runner sets for the workers and the beat it starts (the library itself reads no environment
variables).
"""

from __future__ import annotations

import json
import os
import random
import time

import redis
from celery import Celery

from jobbers_celery import BackoffStrategy, DeadLetterPolicy, JobbersTask, install

REDIS_URL = os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("demo", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    broker_connection_retry_on_startup=True,
    jobbers_scheduler_interval=0.2,
    # Short for the demo, so that a killed worker is noticed in seconds. Production values
    # are the defaults (60 s and 10 s): see docs/howto/long-running.md.
    jobbers_worker_lost_after=3,
    jobbers_cleaner_interval=1,
)
jobbers = install(app)

#: Where the demo's import writes down each chunk it loads (the demo's own key, not jobbers').
CHUNK_LOG = "demo:chunks:{}"
demo_redis = redis.Redis.from_url(REDIS_URL)


class RateLimited(Exception):
    """What a flaky upstream API raises; worth retrying."""


@app.task(base=JobbersTask, bind=True, name="demo.export_report")
def export_report(self: JobbersTask, report_id: int) -> str:
    time.sleep(0.5)
    return f"report-{report_id}.csv"


@app.task(base=JobbersTask, bind=True, name="demo.sync_crm", max_retries=4, retry_delay=0.5,
          backoff_strategy=BackoffStrategy.EXPONENTIAL, max_retry_delay=5,
          expected_exceptions=(RateLimited,), dead_letter_policy=DeadLetterPolicy.SAVE)
def sync_crm(self: JobbersTask, account: str) -> str:
    """Rate limited twice, then succeeds: retries wait in Redis with exponential backoff."""
    if self.request.retries < 2:
        raise RateLimited(f"429 from CRM for {account} (attempt {self.attempt})")
    return f"synced {account}"


@app.task(base=JobbersTask, bind=True, name="demo.import_catalog", max_retries=2,
          retry_delay=0.3, backoff_strategy=BackoffStrategy.CONSTANT,
          expected_exceptions=(RateLimited,), dead_letter_policy=DeadLetterPolicy.SAVE)
def import_catalog(self: JobbersTask, url: str) -> None:
    """Always rate limited: retries run out, the task fails into the dead-letter queue."""
    raise RateLimited(f"upstream keeps refusing {url}")


@app.task(base=JobbersTask, bind=True, name="demo.resize_images",
          dead_letter_policy=DeadLetterPolicy.SAVE)
def resize_images(self: JobbersTask, album: int) -> None:
    """A bug: an unexpected exception fails at once, no retry, straight to the DLQ."""
    sizes = {"small": 64}
    _ = sizes["huge"] * random.random()


@app.task(base=JobbersTask, bind=True, name="demo.import_products", queue="imports",
          max_heartbeat_interval=5, max_stall_recoveries=1,
          dead_letter_policy=DeadLetterPolicy.SAVE)
def import_products(self: JobbersTask, feed: str, chunks: int = 8) -> str:
    """A long import in chunks: heartbeats with progress and a checkpoint, resumes from it.

    max_heartbeat_interval=5 would catch a frozen worker (SIGSTOP, a deadlock); a killed one
    is found sooner by its worker's missing liveness refresh (jobbers_worker_lost_after=3).
    """
    start = self.checkpoint or 0
    log = CHUNK_LOG.format(self.request.id)
    _note(log, event="start", attempt=self.attempt, worker=self.request.hostname,
          checkpoint=self.checkpoint)
    for chunk in range(start + 1, chunks + 1):
        time.sleep(0.5)  # load the chunk
        _note(log, event="chunk", attempt=self.attempt, worker=self.request.hostname,
              chunk=chunk)
        self.heartbeat(progress={"chunks": f"{chunk}/{chunks}"}, checkpoint=chunk)
    return f"imported {chunks} chunks from {feed}"


def _note(key: str, **entry: object) -> None:
    demo_redis.rpush(key, json.dumps(entry))


@app.task(base=JobbersTask, bind=True, name="demo.reindex_search")
def reindex_search(self: JobbersTask, index: str, batches: int = 100) -> int:
    """Long, and cancellable: heartbeat() raises TaskCancelled once jobbers.cancel() ran."""
    for batch in range(1, batches + 1):
        time.sleep(0.2)
        self.heartbeat(progress={"batches": f"{batch}/{batches}"})
    return batches


@app.task(base=JobbersTask, bind=True, name="demo.rebuild_sitemap", max_concurrent=1)
def rebuild_sitemap(self: JobbersTask, part: int) -> str:
    """At most one running at once across all workers; the others are deferred."""
    time.sleep(0.8)
    return f"sitemap-{part}.xml"
