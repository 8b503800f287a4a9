"""The Celery app of the emptied-store test (``celery -A tests.integration.emptied_proj``):
the broker and results on the session's Redis, jobbers' store on ``EMPTIED_STORE`` (a Redis
the test restarts without its data), a ``store_emptied`` alert rule posting to
``EMPTIED_WEBHOOK``, and a short ``jobbers_worker_lost_after`` (a liveness refresh, and so
an epoch check, every second). The test process builds the same app with :func:`build`."""

from __future__ import annotations

import os

from celery import Celery

from jobbers_celery import JobbersTask, install


def build(store: str, webhook: str) -> Celery:
    broker = os.environ["JOBBERS_TEST_REDIS_URL"]
    app = Celery("emptied_proj", broker=broker, backend=broker, set_as_current=False)
    app.conf.update(
        jobbers_redis_url=store,
        jobbers_key_prefix="emptied",
        task_serializer="json", accept_content=["json"], result_serializer="json",
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
        jobbers_worker_lost_after=5,
        jobbers_alerts=[{"name": "store", "kind": "store_emptied", "webhooks": [webhook]}],
        jobbers_alert_webhook_allow_networks=["127.0.0.0/8"],  # the local receiver
    )
    install(app)

    @app.task(base=JobbersTask, name="emptied.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return app


if "EMPTIED_STORE" in os.environ:
    app = build(os.environ["EMPTIED_STORE"], os.environ["EMPTIED_WEBHOOK"])
