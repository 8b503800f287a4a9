"""The Celery app of the payload-codec tests (``celery -A tests.integration.sealed_proj``).

The worker reads the broker and state store from ``JOBBERS_TEST_REDIS_URL`` and its payload
keys from ``SEALED_PROJ_KEYS`` (a JSON list; empty or unset: a worker without keys); the
test process builds the same app with other keys (or none) with :func:`build`. Each task
writes a digest of the password it ran with to ``sealed:ran:<task id>`` (a list), so the
test sees the real values arrived without putting them in Redis.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import redis
from celery import Celery

from jobbers_celery import JobbersTask, install


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def build(url: str, keys: Sequence[str], main: str = "sealed") -> Celery:
    app = Celery(main, broker=url, set_as_current=False)  # no results kept
    app.conf.update(
        jobbers_redis_url=url,
        jobbers_payload_keys=list(keys),
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        jobbers_scheduler_interval=0.2,
        jobbers_publish_lease=2,  # a publish left to another worker is retried soon
        jobbers_worker_lost_after=3,
        jobbers_cleaner_interval=1,
    )
    install(app)

    def ran(task_id: str, password: str) -> None:
        client = redis.Redis.from_url(url)
        client.rpush(f"sealed:ran:{task_id}", digest(password))
        client.close()

    @app.task(base=JobbersTask, bind=True, name="sealed.login", shared=False, max_retries=2,
              dead_letter_policy="save")
    def login(self: JobbersTask, user: str, password: str, note: str = "") -> str:
        """Retries once after a second (a delayed retry the scheduler publishes)."""
        ran(self.request.id, password)
        if self.request.retries == 0:
            raise self.retry(countdown=1)
        return user

    @app.task(base=JobbersTask, bind=True, name="sealed.charge", shared=False, max_retries=0,
              dead_letter_policy="save")
    def charge(self: JobbersTask, card: str, password: str = "", note: str = "") -> None:
        """Fails on its first run (dead-lettered), succeeds once resubmitted."""
        ran(self.request.id, password)
        if self.attempt == 1:
            raise ValueError("card declined")

    return app


if "SEALED_PROJ_KEYS" in os.environ:
    app = build(os.environ["JOBBERS_TEST_REDIS_URL"],
                json.loads(os.environ["SEALED_PROJ_KEYS"] or "[]"))
