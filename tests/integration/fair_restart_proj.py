"""The Celery app of the fair-share store-restart test
(``celery -A tests.integration.fair_restart_proj``): its state store on
``FAIR_RESTART_STORE`` (a private redis-server the test kills), broker and results on
``FAIR_RESTART_BROKER``, keys under ``FAIR_RESTART_PREFIX``. ``fr.one`` runs at most 1 at
once per ``tenant``; each execution of its body writes one file into ``FAIR_RESTART_MARKS``
holding its start time, then its start and end times (local disk: independent of the Redis
that is killed). The test process builds the same app with :func:`build`."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from jobbers_celery import JobbersTask, install
from tests.testapp import make_app


def build(store: str, broker: str, prefix: str) -> Celery:
    app = make_app("fair_restart_proj", store, broker=broker, backend=broker,
                   jobbers_store_shards=1, jobbers_key_prefix=prefix,
                   jobbers_worker_lost_after=10, jobbers_scheduler_interval=0.1)
    install(app)

    @app.task(base=JobbersTask, bind=True, name="fr.one", shared=False, max_concurrent=1,
              concurrency_key="tenant")
    def one(self: Any, tenant: str, seconds: float) -> None:
        mark = Path(os.environ["FAIR_RESTART_MARKS"]) / f"{self.request.id}.{uuid.uuid4().hex[:8]}"
        start = time.time()
        mark.write_text(f"{start}")
        time.sleep(seconds)
        mark.write_text(f"{start} {time.time()}")

    return app


_STORE = os.environ.get("FAIR_RESTART_STORE")
if _STORE:  # a worker's (the test imports build() before its server is known)
    app = build(_STORE, os.environ["FAIR_RESTART_BROKER"], os.environ["FAIR_RESTART_PREFIX"])
