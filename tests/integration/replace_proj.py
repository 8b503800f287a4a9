"""The Celery app of the tests of ``self.replace()``, ``Reject`` and a hard time limit
(``celery -A tests.integration.replace_proj``): the same task code as a plain ``celery.Task`` or as a
``JobbersTask`` (``REPLACE_PROJ_KIND=plain|jobbers``), its broker, result backend and state
store all on ``REPLACE_PROJ_URL``. The tests build the client app with :func:`make_app`."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, Task, chain, group
from celery.exceptions import Reject

from jobbers_celery import JobbersTask, install


def make_app(kind: str, url: str) -> Celery:
    """The app of ``kind`` (``plain`` or ``jobbers``) on ``url``, with its tasks ``rp.*``."""
    app = Celery(f"replace_{kind}", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        task_serializer="json", accept_content=["json"], result_serializer="json",
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
        jobbers_redis_url=url, jobbers_scheduler_interval=0.2,
    )
    base: type[Task[Any, Any]] = JobbersTask if kind == "jobbers" else Task
    if kind == "jobbers":
        install(app)

    @app.task(base=base, bind=True, name="rp.add", shared=False)
    def add(self: Task[Any, Any], x: int, y: int) -> int:
        return x + y

    @app.task(base=base, bind=True, name="rp.replaced", shared=False)
    def replaced(self: Task[Any, Any], x: int) -> Any:
        return self.replace(add.s(x, 100))

    @app.task(base=base, bind=True, name="rp.fan", shared=False)
    def fan(self: Task[Any, Any], x: int) -> Any:
        return self.replace(group(add.s(x, 1), add.s(x, 2)))

    @app.task(base=base, bind=True, name="rp.chained", shared=False)
    def chained(self: Task[Any, Any], x: int) -> Any:
        return self.replace(chain(add.s(x, 1), add.s(10)))

    @app.task(base=base, bind=True, name="rp.rejected", shared=False)
    def rejected(self: Task[Any, Any]) -> None:
        raise Reject("no thanks", requeue=False)

    @app.task(base=base, bind=True, name="rp.hard_limit", shared=False, time_limit=1)
    def hard_limit(self: Task[Any, Any]) -> None:
        time.sleep(30)

    return app


if os.environ.get("REPLACE_PROJ_URL"):
    app = make_app(os.environ.get("REPLACE_PROJ_KIND", "jobbers"), os.environ["REPLACE_PROJ_URL"])
