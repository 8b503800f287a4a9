"""The Celery app of the tests of how a task ends (``celery -A tests.integration.ending_proj``):
the same task code as a plain ``celery.Task`` (``<name>.plain_*``) and as a ``JobbersTask``
(``<name>.jobbers_*``), for differential tests.

The worker reads its broker from ``ENDING_PROJ_BROKER``, its state store from
``ENDING_PROJ_STORE`` (default: the broker), its result backend from ``ENDING_PROJ_BACKEND``
(default: the broker), its task names' prefix from ``ENDING_PROJ_NAME``, and
``task_acks_late`` / ``task_reject_on_worker_lost`` from ``ENDING_PROJ_ACKS_LATE=1`` /
``ENDING_PROJ_REJECT_ON_LOST=1``.

Fault injection: ``ENDING_PROJ_KILL`` names the point where the pool process running a task
SIGKILLs itself, once per task id (a marker file in ``ENDING_PROJ_MARKS``, so the redelivered
copy runs through): ``after_step`` right after jobbers' ``completed`` step returns,
``after_write`` right after Celery's result write (``Backend.mark_as_done``) returns,
``in_body`` in the body (the ``lost`` tasks only). Each body writes a marker
``<id>.<n>.run`` when it starts, so runs are counted.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject

from jobbers_celery import JobbersTask, install
from jobbers_celery.lifecycle.recorder import Recorder


def _marks() -> Path | None:
    marks = os.environ.get("ENDING_PROJ_MARKS")
    return Path(marks) if marks else None


def _ran(task: Task[Any, Any]) -> None:
    marks = _marks()
    if marks is not None:
        (marks / f"{task.request.id}.{uuid.uuid4().hex[:8]}.run").touch()


def _kill_once(point: str, task_id: str | None) -> None:
    """SIGKILL this process at ``point`` if the environment asks for it, once per task."""
    marks = _marks()
    if os.environ.get("ENDING_PROJ_KILL") != point or marks is None or not task_id:
        return
    killed = marks / f"{task_id}.killed"
    if killed.exists():
        return
    # when, for the window the test measures; written whole then renamed, as the test
    # polls for the file and would otherwise read it empty between create and write
    part = marks / f"{task_id}.killed.part"
    part.write_text(f"{time.time()!r}")
    os.replace(part, killed)
    os.kill(os.getpid(), signal.SIGKILL)


def _inject_faults(app: Celery) -> None:
    point = os.environ.get("ENDING_PROJ_KILL")
    if point == "after_step":
        complete = Recorder.complete

        @functools.wraps(complete)
        def complete_then_die(self: Recorder, run: Any, **kwargs: Any) -> Any:
            res = complete(self, run, **kwargs)
            _kill_once(point, run.task_id)
            return res

        Recorder.complete = complete_then_die  # type: ignore[method-assign]
    elif point == "after_write":
        backend_cls = type(app.backend)
        mark_as_done = backend_cls.mark_as_done

        @functools.wraps(mark_as_done)
        def done_then_die(self: Any, task_id: str, *args: Any, **kwargs: Any) -> Any:
            out = mark_as_done(self, task_id, *args, **kwargs)
            _kill_once(point, task_id)
            return out

        backend_cls.mark_as_done = done_then_die  # type: ignore[method-assign]


class Unencodable:
    """A value no JSON serializer encodes."""

    def __repr__(self) -> str:
        return "<Unencodable>"


def build(broker: str, store: str | None = None, backend: str | None = None,
          name: str = "ending", acks_late: bool = False,
          reject_on_worker_lost: bool = False) -> Celery:
    app = Celery(name, broker=broker, backend=backend or broker, set_as_current=False)
    app.conf.update(
        jobbers_redis_url=store,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        jobbers_scheduler_interval=0.2,
        jobbers_worker_lost_after=3,
        jobbers_cleaner_interval=1,
        task_acks_late=acks_late,
        task_reject_on_worker_lost=reject_on_worker_lost,
        worker_prefetch_multiplier=1,
    )
    install(app)

    def ret(self: Task[Any, Any], value: Any) -> Any:
        _ran(self)
        return value

    def unencodable(self: Task[Any, Any]) -> Any:
        _ran(self)
        return Unencodable()

    def lost(self: Task[Any, Any], seconds: float) -> str:
        """Killed in its body the first time (``ENDING_PROJ_KILL=in_body``), else sleeps."""
        _ran(self)
        _kill_once("in_body", self.request.id)
        time.sleep(seconds)
        return "done"

    for fun in (ret, unencodable):
        app.task(bind=True, name=f"{name}.plain_{fun.__name__}", shared=False)(fun)
        app.task(base=JobbersTask, bind=True, name=f"{name}.jobbers_{fun.__name__}",
                 shared=False)(fun)
        app.task(base=JobbersTask, bind=True, name=f"{name}.jobbers_{fun.__name__}_save",
                 shared=False, dead_letter_policy="save")(fun)
    def rejected(self: Task[Any, Any]) -> str:
        """Raises ``Reject(requeue=True)`` the first time it runs, then returns."""
        _ran(self)
        marks = _marks()
        if marks is not None and not (marks / f"{self.request.id}.rejected").exists():
            (marks / f"{self.request.id}.rejected").touch()
            raise Reject("not now", requeue=True)
        return "done"

    app.task(bind=True, name=f"{name}.plain_rejected", shared=False, acks_late=True)(rejected)
    app.task(base=JobbersTask, bind=True, name=f"{name}.jobbers_rejected", shared=False,
             acks_late=True)(rejected)
    # a lost worker process under acks_late: <variant>_lost_<how>
    lost_options: dict[str, dict[str, Any]] = {
        "requeued": {"reject_on_worker_lost": True},  # Celery requeues the message
        "acked": {},  # Celery acknowledges it and stores FAILURE
    }
    for how, options in lost_options.items():
        app.task(bind=True, name=f"{name}.plain_lost_{how}", shared=False, acks_late=True,
                 **options)(lost)
        app.task(base=JobbersTask, bind=True, name=f"{name}.jobbers_lost_{how}", shared=False,
                 acks_late=True, dead_letter_policy="save", **options)(lost)
    app.task(base=JobbersTask, bind=True, name=f"{name}.jobbers_lost_refused", shared=False,
             acks_late=True, reject_on_worker_lost=True, on_worker_lost="fail",
             dead_letter_policy="save")(lost)
    app.task(base=JobbersTask, bind=True, name=f"{name}.jobbers_lost_rerun", shared=False,
             acks_late=True, on_worker_lost="rerun", dead_letter_policy="save")(lost)
    return app


if "ENDING_PROJ_BROKER" in os.environ:
    app = build(os.environ["ENDING_PROJ_BROKER"], os.environ.get("ENDING_PROJ_STORE") or None,
                os.environ.get("ENDING_PROJ_BACKEND") or None,
                os.environ.get("ENDING_PROJ_NAME") or "ending",
                os.environ.get("ENDING_PROJ_ACKS_LATE") == "1",
                os.environ.get("ENDING_PROJ_REJECT_ON_LOST") == "1")
    _inject_faults(app)
