"""A small Celery app with jobbers installed: the tasks the demo submits.

The Redis URL comes from the ``DEMO_REDIS_URL`` environment variable, which the demo
runner sets for the worker it starts (the library itself reads no environment variables).
"""

from __future__ import annotations

import os
import random
import time

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
)
jobbers = install(app)


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
