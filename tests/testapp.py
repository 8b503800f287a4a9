"""The configuration every test Celery app starts from (``tests.integration.proj``, the
Django tests' ``celery_app``, and the apps of the periodic and search tests): JSON only,
Celery's startup retry, the test's own logging, a quick scheduler, and the dataset layout
they share. Each app adds its own settings on top (a keyword overrides a default)."""

from __future__ import annotations

from typing import Any

from celery import Celery

__all__ = ["SHARDS", "make_app"]

#: The shards of the dataset the apps on one test Redis share (same server, same prefix):
#: its layout, which every worker of it must agree on (the sharded layout on one server too).
SHARDS = 16


def make_app(main: str, store: str, *, broker: str | None = None, backend: str | None = None,
             **conf: Any) -> Celery:
    """A Celery app named ``main`` whose jobbers state is in ``store`` (broker and result
    backend too, unless ``broker`` or ``backend`` name others); ``conf``: its own settings."""
    app = Celery(main, broker=broker or store, backend=backend or store)
    app.conf.update({
        "jobbers_redis_url": store,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "jobbers_scheduler_interval": 0.2,
        "jobbers_store_shards": SHARDS,
        **conf,
    })
    return app
