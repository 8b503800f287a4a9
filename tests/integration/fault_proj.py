"""The Celery app of the Sentinel failover and Redis restart tests
(``celery -A tests.integration.fault_proj``).

The worker reads its broker from ``FAULT_PROJ_BROKER`` (``redis://`` or kombu's
``sentinel://`` form, with ``FAULT_PROJ_MASTER`` as ``master_name``) and its state store
from ``FAULT_PROJ_STORE`` (default: the broker), its task names from ``FAULT_PROJ_NAME``,
its result backend from ``FAULT_PROJ_BACKEND`` (default: the broker),
``jobbers_worker_lost_after`` from ``FAULT_PROJ_LOST_AFTER``, ``task_acks_late`` from
``FAULT_PROJ_ACKS_LATE=1`` and, with ``FAULT_PROJ_RESTORE`` (seconds), kombu's
``visibility_timeout`` with a sweep every second (see ``plain_fault_proj.restore_options``);
the test process
builds the same app with :func:`build`. Each task body writes a marker file into
``FAULT_PROJ_MARKS`` when it starts, so executions are counted without the Redis that fails;
each message a worker gives back for want of the store writes one into
``FAULT_PROJ_GIVEN``.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from celery import Celery, signals

from jobbers_celery import JobbersTask, install
from jobbers_celery.worker.task import HEADER_GIVEN_BACK
from tests.integration.plain_fault_proj import restore_options

#: Seconds without a liveness refresh before a worker is lost: a 6 s outage gap
#: (3 refresh periods of 2 s), longer than the restart test's 3 s outage, as in production
#: (60 s: 6 s gap) where the fault-injection run showed false stalls.
LOST_AFTER_S = 10


def _mark(task: JobbersTask) -> None:
    marks = os.environ.get("FAULT_PROJ_MARKS")
    if marks:
        (Path(marks) / f"{task.request.id}.{uuid.uuid4().hex[:8]}").touch()


@signals.after_task_publish.connect(weak=False)
def _given_back(headers: dict[str, object] | None = None, **_: object) -> None:
    """A message given back, once the broker took it (not a retry of one: it keeps the
    header, with the retry count of the delivery that was given back)."""
    given = os.environ.get("FAULT_PROJ_GIVEN")
    header = str((headers or {}).get(HEADER_GIVEN_BACK) or "")
    if given and header and header.rpartition("/")[2] == str((headers or {}).get("retries")
                                                            or 0):
        (Path(given) / f"{(headers or {}).get('id')}.{uuid.uuid4().hex[:8]}").touch()


def build(broker: str, master_name: str | None = None, store: str | None = None,
          name: str = "fault", backend: str | None = None, lost_after: float = LOST_AFTER_S,
          acks_late: bool = False, restore: float | None = None) -> Celery:
    """The app, with results in the broker's Redis (over Sentinel too) and short
    thresholds; the state store is the broker's Redis unless ``store`` is given. Its tasks
    are ``<name>.beating``, ``<name>.quiet``, ``<name>.short`` and ``<name>.retrying``:
    each test uses its own name, since a publish is recorded by the first installed app that
    knows the task's name. ``backend``: the result backend (default: the broker, which must then be Redis);
    ``lost_after``: ``jobbers_worker_lost_after`` (how long a step waits out an outage);
    ``restore``: a Redis broker's ``visibility_timeout``, swept every second (the messages
    a worker had taken when the broker went away come back that long after delivery)."""
    # not the test process's current app: publishes of names no app knows stay with it
    app = Celery(name, broker=broker, backend=backend or broker, set_as_current=False)
    transport: dict[str, object] = {"master_name": master_name} if master_name else {}
    app.conf.update(
        jobbers_redis_url=store,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        broker_transport_options={**transport, **(restore_options(restore) if restore else {})},
        result_backend_transport_options=transport,
        jobbers_scheduler_interval=0.2,
        jobbers_worker_lost_after=lost_after,
        task_acks_late=acks_late,
        jobbers_cleaner_interval=1,
    )
    install(app)

    @app.task(base=JobbersTask, bind=True, name=f"{name}.beating", shared=False,
              max_heartbeat_interval=2,
              max_stall_recoveries=1, dead_letter_policy="save")
    def beating(self: JobbersTask, seconds: float) -> str:
        """Heartbeats every 0.1 s (sent at most every 0.5 s) for ``seconds``."""
        _mark(self)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.1)
            self.heartbeat()
        return "done"

    @app.task(base=JobbersTask, bind=True, name=f"{name}.quiet", shared=False,
              max_stall_recoveries=1,
              dead_letter_policy="save")
    def quiet(self: JobbersTask, seconds: float) -> str:
        """Never heartbeats: only its worker's liveness says it is alive."""
        _mark(self)
        time.sleep(seconds)
        return "done"

    @app.task(base=JobbersTask, bind=True, name=f"{name}.short", shared=False)
    def short(self: JobbersTask, seconds: float) -> str:
        """Sleeps ``seconds``: one of a load of a few hundred."""
        _mark(self)
        time.sleep(seconds)
        return "done"

    @app.task(base=JobbersTask, bind=True, name=f"{name}.retrying", shared=False,
              expected_exceptions=(LookupError,), max_retries=1)
    def retrying(self: JobbersTask, seconds: float) -> str:
        """Sleeps ``seconds``, then its first attempt raises an expected exception (an
        immediate retry); the second returns."""
        _mark(self)
        time.sleep(seconds)
        if self.attempt == 1:
            raise LookupError("first attempt")
        return "done"

    return app


if "FAULT_PROJ_BROKER" in os.environ:
    app = build(os.environ["FAULT_PROJ_BROKER"], os.environ.get("FAULT_PROJ_MASTER") or None,
                os.environ.get("FAULT_PROJ_STORE") or None,
                os.environ.get("FAULT_PROJ_NAME") or "fault",
                os.environ.get("FAULT_PROJ_BACKEND") or None,
                float(os.environ.get("FAULT_PROJ_LOST_AFTER") or LOST_AFTER_S),
                os.environ.get("FAULT_PROJ_ACKS_LATE") == "1",
                float(os.environ["FAULT_PROJ_RESTORE"]) if os.environ.get("FAULT_PROJ_RESTORE")
                else None)
