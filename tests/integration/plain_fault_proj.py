"""A plain Celery app, without jobbers (``celery -A tests.integration.plain_fault_proj``): what
Celery and kombu do by themselves when the Redis broker is killed and restarted.

The worker reads its broker from ``PLAIN_PROJ_BROKER`` and, with ``PLAIN_PROJ_RESTORE`` set
to a number of seconds, uses it as kombu's ``visibility_timeout`` and sweeps the unacked
messages every second (see :data:`RESTORE_OPTIONS`). Each task body writes a marker file
into ``PLAIN_PROJ_MARKS`` when it starts, so executions are counted without the broker.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery


def restore_options(visibility_timeout: float) -> dict[str, Any]:
    """kombu's Redis transport options that give back, ``visibility_timeout`` seconds after
    their delivery, the messages a worker had taken but could not restore when the broker
    went away (checked every second instead of every ~100 s)."""
    return {"visibility_timeout": visibility_timeout, "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1}


def build(broker: str, restore: float | None = None) -> Celery:
    app = Celery("plain", broker=broker, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        broker_transport_options=restore_options(restore) if restore else {},
    )

    @app.task(bind=True, name="plain.short", shared=False)
    def short(self: Any, seconds: float) -> str:
        marks = os.environ.get("PLAIN_PROJ_MARKS")
        if marks:
            (Path(marks) / f"{self.request.id}.{uuid.uuid4().hex[:8]}").touch()
        time.sleep(seconds)
        return "done"

    return app


if "PLAIN_PROJ_BROKER" in os.environ:
    app = build(os.environ["PLAIN_PROJ_BROKER"],
                float(os.environ["PLAIN_PROJ_RESTORE"]) if os.environ.get("PLAIN_PROJ_RESTORE")
                else None)
