"""The Celery app of ``bench/dlq.py`` (benchmark scaffolding, not library code).

Redis broker, result backend and jobbers store on the run's private server
(``BENCH_REDIS_URL``), jobbers installed with the Django dead-letter sink: what a project
using ``jobbers_django`` configures. The benchmark only publishes (resubmissions); no worker
consumes, so every resubmitted message stays in its queue's list, where it is counted.
"""

from __future__ import annotations

import os

from celery import Celery

from jobbers_celery import install

REDIS_URL = os.environ["BENCH_REDIS_URL"]

app = Celery("dlqbench", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    broker_connection_retry_on_startup=True,
    jobbers_dead_letter_sink="jobbers_django.sink.DjangoDeadLetterSink",
)
jobbers = install(app)
