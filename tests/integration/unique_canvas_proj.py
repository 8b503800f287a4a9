"""The same small canvas project twice, for test_unique_canvas_parity.py: once with plain
``celery.Task`` tasks (no jobbers), once with ``JobbersTask`` tasks whose ``member`` and
``callback`` are unique (``install(app)``); task code and names identical.

A worker runs one of them: ``celery -A tests.integration.unique_canvas_proj worker`` with
``UNIQUE_CANVAS_VARIANT`` (``plain`` or ``jobbers``) and ``UNIQUE_CANVAS_URL`` (the
variant's database: broker, results and, for jobbers, the store). The test process builds
both with :func:`build`.

In the plain variant a member is "revoked before it ran" with Celery's own
``app.control.revoke``; in the jobbers variant it is a duplicate of a copy that holds its
key (published to a queue no worker reads, so it holds the key for the whole test).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task

from jobbers_celery import JobbersTask, Unique, install

VARIANTS = ("plain", "jobbers")
#: The queue of the copies holding a key (no worker reads it).
IDLE = "uqc_idle"


def build(variant: str, url: str) -> Celery:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    app = Celery(f"uqc_{variant}", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        task_serializer="json", accept_content=["json"], result_serializer="json",
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1, result_expires=600,
    )
    base: type[Task[Any, Any]] = Task
    unique: dict[str, Any] = {}
    if variant == "jobbers":
        app.conf.update(jobbers_redis_url=url, jobbers_key_prefix="uqc",
                        jobbers_scheduler_interval=0.2)
        install(app)
        base, unique = JobbersTask, {"unique": Unique(on=("key",))}

    @app.task(base=base, name="uqc.member", shared=False, **unique)
    def member(key: str) -> str:
        return key

    @app.task(base=base, name="uqc.total", shared=False)
    def total(values: Any) -> int:
        """A chain's later link, or a chord's callback that is not unique."""
        return len(values) if isinstance(values, list) else 1

    @app.task(base=base, name="uqc.callback", shared=False, **unique)
    def callback(values: Any, key: str) -> int:
        """A chord's callback, unique in the jobbers variant (its key: ``key``)."""
        return len(values) if isinstance(values, list) else 1

    return app


VARIANT = os.environ.get("UNIQUE_CANVAS_VARIANT")
if VARIANT is not None:  # a worker's process
    app = build(VARIANT, os.environ["UNIQUE_CANVAS_URL"])
