"""The app ``bench/fairness.py`` runs (``celery -A fairness_app worker``): two tasks of the
same body, ``fair.plain`` (no cap) and ``fair.keyed`` (``max_concurrent=BENCH_CAP`` per
``tenant``, fair shares). Each sleeps ``ms`` milliseconds.

Environment (set by ``fairness.py``; benchmark scaffolding, not library code):
``BENCH_URL`` broker, results and jobbers store (one private redis-server);
``BENCH_SHARDS`` ``jobbers_store_shards``; ``BENCH_CAP`` the cap per tenant (2).
"""

from __future__ import annotations

import os
import time

import bench_hooks  # noqa: F401 - signals readiness
from celery import Celery

from jobbers_celery import JobbersTask, install

URL = os.environ["BENCH_URL"]
CAP = int(os.environ.get("BENCH_CAP", "2"))

app = Celery("fairness", broker=URL, backend=URL, set_as_current=False)
app.conf.update(task_serializer="json", accept_content=["json"], result_serializer="json",
                broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                jobbers_redis_url=URL, jobbers_store_shards=int(os.environ.get("BENCH_SHARDS", "1")),
                task_ignore_result=True, worker_prefetch_multiplier=1)
jobbers = install(app)


@app.task(base=JobbersTask, name="fair.plain", shared=False)
def plain(tenant: str, ms: float) -> None:
    time.sleep(ms / 1000)


@app.task(base=JobbersTask, name="fair.keyed", shared=False, max_concurrent=CAP,
          concurrency_key="tenant")
def keyed(tenant: str, ms: float) -> None:
    time.sleep(ms / 1000)
