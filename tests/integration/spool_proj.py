"""The Celery app of the dead-letter spool test (``celery -A tests.integration.spool_proj``).

The worker reads its broker from ``SPOOL_PROJ_BROKER``, jobbers' state store from
``SPOOL_PROJ_STORE`` (a Redis the test stops while the sink fails), the spool root from
``SPOOL_PROJ_DIR`` and the directory of :class:`GateSink` from ``SPOOL_PROJ_GATE``; the
test process builds the same app with :func:`build`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery

from jobbers_celery import JobbersTask, install
from jobbers_celery.core.records import DeadLetter


class GateSink:
    """A sink the test drives with files in ``SPOOL_PROJ_GATE``.

    Every call appends ``<task_id>:<attempt>`` to ``writes``. While ``broken`` exists, a
    write announces itself (``writing-<task_id>``), waits for ``go`` (the test cuts Redis
    meanwhile), then raises an error that quotes the entry's arguments, as a database error
    quoting the refused row would. Otherwise the entry is stored as
    ``stored/<task_id>-<attempt>.json``, once (idempotent per task and attempt).
    """

    def __init__(self, jobbers: Any = None) -> None:
        self.gate = Path(os.environ.get("SPOOL_PROJ_GATE", "/nonexistent"))

    def write(self, entry: DeadLetter) -> None:
        with (self.gate / "writes").open("a") as f:
            f.write(f"{entry.task_id}:{entry.attempt}\n")
        if (self.gate / "broken").exists():
            (self.gate / f"writing-{entry.task_id}").touch()
            deadline = time.monotonic() + 60
            while not (self.gate / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise ConnectionError(f"sink database unreachable; refused row "
                                  f"{json.dumps(entry.args)} {entry.kwargs!r}")
        stored = self.gate / "stored"
        stored.mkdir(exist_ok=True)
        try:
            fd = os.open(stored / f"{entry.task_id}-{entry.attempt}.json",
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            json.dump(entry.to_json(), f, default=str)


def build(broker: str, store: str, spool: str) -> Celery:
    app = Celery("spool", broker=broker, set_as_current=False)  # no results kept
    app.conf.update(
        jobbers_redis_url=store,
        jobbers_dead_letter_sink="tests.integration.spool_proj.GateSink",
        jobbers_dead_letter_spool=spool,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        jobbers_scheduler_interval=0.2,
        jobbers_worker_lost_after=3,
        jobbers_cleaner_interval=1,
    )
    install(app)

    @app.task(base=JobbersTask, bind=True, name="spool.charge", shared=False,
              dead_letter_policy="save")
    def charge(self: JobbersTask, card: str, token: str = "") -> None:
        """Fails without quoting its arguments (Celery logs the exception)."""
        raise ValueError("card declined")

    return app


if "SPOOL_PROJ_BROKER" in os.environ:
    app = build(os.environ["SPOOL_PROJ_BROKER"], os.environ["SPOOL_PROJ_STORE"],
                os.environ["SPOOL_PROJ_DIR"])
