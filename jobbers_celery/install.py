"""install(app): wire jobbers into a Celery app, once.

It builds the app's :class:`~jobbers_celery.jobbers.Jobbers` (the composition root), registers
it, connects the signal handlers and adds the worker runtime's bootsteps; the Celery adapter
modules (task, request, signals, runtime) reach the services through it, never the other way.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from celery import Celery

from jobbers_celery.core import redaction
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.core.options import OPTION_NAMES, validate_options
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import publisher
from jobbers_celery.telemetry import metrics
from jobbers_celery.worker import logfilter, signals
from jobbers_celery.worker.refusals import RefusalStep, connect_refusals
from jobbers_celery.worker.runtime import ShutdownStep, WorkerStep

__all__ = ["get_jobbers", "install"]

_lock = threading.Lock()


def install(app: Celery) -> Jobbers:
    """Install jobbers on ``app`` (idempotent) and return its :class:`Jobbers`.

    Reads the ``jobbers_*`` settings, connects the signal handlers, adds the scheduler and
    liveness thread to the app's workers (and the step that ends refused messages), registers the ``jobbers.clean`` task and its
    ``beat_schedule`` entry, and makes ``@app.task(base=JobbersTask, ...)`` validate its
    options when the decorator runs.
    """
    with _lock:
        existing = Jobbers.find(app)
        if existing is not None:
            return existing
        config = JobbersConfig.from_mapping(app.conf, app.conf.broker_url)
        jobbers = Jobbers(app, config)
        jobbers.register()
        redaction.use_keys(config.redact_keys)  # the record's and dead letter's tracebacks
        logfilter.install()  # Celery's own log records, at every level
        metrics.watch(Jobbers.installed)
        signals.connect()
        connect_refusals()
        app.steps["consumer"].add(RefusalStep)
        app.steps["worker"].add(WorkerStep)
        app.steps["worker"].add(ShutdownStep)
        _add_cleaner(app, config)
        _validate_on_declaration(app)
        _mark_publishes(app)
        return jobbers


def _mark_publishes(app: Celery) -> None:
    """Every publish of ``app`` (``apply_async``, canvas, ``send_task``, jobbers' own: all go
    through ``app.send_task``) is marked as the app's (:func:`publisher.mark_publishing`), because
    ``before_task_publish`` names only the task and two apps of one process may register
    the same name: the sending app's store must record it."""
    send_task = app.send_task

    @functools.wraps(send_task)
    def send_task_marked(*args: Any, **kwargs: Any) -> Any:
        token = publisher.mark_publishing(app)  # no context manager: on every publish
        try:
            return send_task(*args, **kwargs)
        finally:
            publisher.unmark_publishing(token)

    app.send_task = send_task_marked  # type: ignore[method-assign]


def get_jobbers(app: Celery) -> Jobbers:
    """The :class:`Jobbers` that ``install(app)`` returned (:meth:`Jobbers.of`)."""
    return Jobbers.of(app)


#: Name of the cleaner task and of its ``beat_schedule`` entry.
CLEANER_TASK = "jobbers.clean"


def _add_cleaner(app: Celery, config: JobbersConfig) -> None:
    """Register the cleaner task and schedule it every ``jobbers_cleaner_interval`` seconds.

    The entry goes into ``app.conf.beat_schedule``, which celery beat's default scheduler
    reads, and which django-celery-beat's ``DatabaseScheduler`` copies into its tables when
    beat starts. A message older than one interval expires unrun, so passes never pile up
    behind a stopped worker: the expiry is the task's own (``Task.expires``), because
    django-celery-beat drops an entry's ``expires`` option.
    """

    @app.task(name=CLEANER_TASK, ignore_result=True, shared=False,
              expires=config.cleaner_interval)
    def clean() -> dict[str, Any]:
        return Jobbers.of(app).cleaner.run(by="beat").as_dict()

    schedule = dict(app.conf.beat_schedule or {})
    schedule.setdefault(CLEANER_TASK, {"task": CLEANER_TASK,
                                       "schedule": config.cleaner_interval})
    app.conf.beat_schedule = schedule


def _validate_on_declaration(app: Celery) -> None:
    """Celery creates task classes lazily; check jobbers options when the decorator runs."""
    from jobbers_celery.worker.task import JobbersTask

    original = app.task

    @functools.wraps(original)
    def task(*args: Any, **opts: Any) -> Any:
        base = opts.get("base")
        if isinstance(base, type) and issubclass(base, JobbersTask):
            validate_options({**{n: getattr(base, n) for n in OPTION_NAMES}, **opts})
        return original(*args, **opts)

    app.task = task  # type: ignore[method-assign]
