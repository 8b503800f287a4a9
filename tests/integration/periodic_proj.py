"""``celery -A tests.integration.periodic_proj beat|worker``: a beat schedule to watch.

``tick`` every second (a quick task) and ``slow`` every second (a task that runs 2.5 s:
its runs overlap), the cleaner on a queue of its own (``jobbers``), a short tolerance and
check interval (``PERIODIC_TOLERANCE``, ``PERIODIC_CHECK``) so that verdicts come in
seconds; the tolerance, 2 s, is still wide enough that a beat running late on a loaded
machine has none of its slots counted missed (with 0.5 s, a beat late by that much once
while alive had a slot missed). Every alert the watch emits is also pushed, with the Redis
clock's time, to the list ``test:periodic:alerts`` (the test reads when each came);
``PERIODIC_WEBHOOK``: a rule sends ``tick``'s missed slots to that URL."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

from jobbers_celery import JobbersTask, install
from tests.testapp import make_app

REDIS_URL = os.environ["JOBBERS_TEST_REDIS_URL"]
ALERTS = "test:periodic:alerts"

app = make_app(
    "periodic_proj", REDIS_URL,
    jobbers_cleaner_interval=1,
    jobbers_cleaner_queue="jobbers",
    jobbers_periodic_tolerance=float(os.environ.get("PERIODIC_TOLERANCE", "2")),
    jobbers_periodic_check_interval=float(os.environ.get("PERIODIC_CHECK", "0.25")),
    beat_schedule={
        "tick": {"task": "periodic.tick", "schedule": 1.0},
        "slow": {"task": "periodic.slow", "schedule": 1.0},
    },
)
if os.environ.get("PERIODIC_WEBHOOK"):  # a local receiver of the missed-slot alerts
    app.conf.jobbers_alerts = [{"name": "beat-watch", "kind": "periodic_missed",
                                "schedule": "tick", "min_interval": 1,
                                "webhooks": [os.environ["PERIODIC_WEBHOOK"]]}]
    app.conf.jobbers_alert_webhook_allow_networks = ["127.0.0.0/8"]  # the local receiver
jobbers = install(app)
_client = redis.Redis.from_url(REDIS_URL)
_emit = jobbers.periodic.emit


def _recording(event: Any) -> None:
    seconds, micros = _client.time()
    _client.rpush(ALERTS, json.dumps({"kind": str(event.kind), "key": event.key,
                                      "title": event.title,
                                      "at": seconds * 1000 + micros // 1000}))
    if _emit is not None:
        _emit(event)


jobbers.periodic.emit = _recording


@app.task(base=JobbersTask, name="periodic.tick")
def tick() -> int:
    return 1


@app.task(base=JobbersTask, name="periodic.slow")
def slow() -> int:
    time.sleep(2.5)
    return 2


__all__ = ["ALERTS", "app", "jobbers"]
