"""``celery -A tests.integration.bound_proj worker``: ``tests.integration.proj`` whose queue
``h9-q`` is declared bound to the direct exchange ``h9-e`` by the key ``h9-daily`` (a
binding another queue may share: tests/integration/test_pauses.py)."""

from __future__ import annotations

from kombu import Exchange, Queue

from tests.integration.proj import app

__all__ = ["app"]

app.conf.task_queues = [
    Queue("celery"),
    Queue("h9-q", Exchange("h9-e", type="direct"), routing_key="h9-daily"),
]
