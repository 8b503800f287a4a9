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
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.unique import HeldElsewhere
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import bodyjson, bulk, publisher
from jobbers_celery.lifecycle.recorder import publishing
from jobbers_celery.telemetry import metrics
from jobbers_celery.worker import bulk as bulk_publish
from jobbers_celery.worker import canvas, logfilter, periodic, signals, taskpublish, taskrepr
from jobbers_celery.worker.pause import PauseStep, SourceStep
from jobbers_celery.worker.refusals import RefusalStep, connect_refusals
from jobbers_celery.worker.runtime import ShutdownStep, WorkerStep

__all__ = ["get_jobbers", "install"]

_lock = threading.Lock()
log = escaped_logger("jobbers.install")


def install(app: Celery) -> Jobbers:
    """Install jobbers on ``app`` (idempotent) and return its :class:`Jobbers`.

    Reads the ``jobbers_*`` settings, connects the signal handlers, adds the scheduler and
    liveness thread to the app's workers (and the step that ends refused messages), registers the ``jobbers.clean`` task and its
    ``beat_schedule`` entry, and makes ``@app.task(base=JobbersTask, ...)`` validate its
    options when the decorator runs. The app's ``celery.starmap`` and ``celery.map``
    builtins (what ``starmap``, ``map`` and ``chunks`` publish) become tracked tasks, and its
    ``celery.chord_unlock`` waits for a dead-lettered chord member's resubmit
    (:mod:`jobbers_celery.worker.canvas`); other apps keep Celery's.
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
        periodic.connect()  # the beat watch: beat's schedule and publishes, runs
        connect_refusals()
        app.steps["consumer"].add(RefusalStep)
        app.steps["worker"].add(WorkerStep)
        app.steps["worker"].add(ShutdownStep)
        app.steps["worker"].add(PauseStep)
        app.steps["consumer"].add(SourceStep)
        _add_cleaner(app, config)
        _validate_on_declaration(app)
        _mark_publishes(app)
        canvas.track_builtins(app)  # starmap/chunks: each chunk a tracked task
        bulk_publish.install()  # a group's members recorded a batch at a time
        return jobbers


def _mark_publishes(app: Celery) -> None:
    """Every publish of ``app`` (``apply_async``, canvas, ``send_task``, jobbers' own: all go
    through ``app.send_task``) is marked as the app's (:func:`publisher.mark_publishing`), because
    ``before_task_publish`` names only the task and two apps of one process may register
    the same name: the sending app's store must record it. A publish that raises (an
    argument kombu cannot encode, a broker it cannot reach) ends the ``submitted`` record it
    made, ``dropped`` at once (:func:`~jobbers_celery.lifecycle.recorder.publishing`). A
    fair-share task the app registers, sent by name, is published by its own
    ``apply_async`` (:func:`~jobbers_celery.worker.taskpublish.fair_send_task`), which
    parks it when its key has no room."""
    send_task = app.send_task

    @functools.wraps(send_task)
    def send_task_marked(*args: Any, **kwargs: Any) -> Any:
        if "task_type" not in kwargs:  # by name (a task's apply_async names itself)
            by_name = taskpublish.fair_send_task(app, args, kwargs)
            if by_name is not None:  # a registered fair-share task: its apply_async
                return by_name
        token = publisher.mark_publishing(app)  # no context manager: on every publish
        batched = bulk.enter(kwargs.get("producer"))  # held by a group's bulk publish?
        try:
            if "argsrepr" not in kwargs and "kwargsrepr" not in kwargs \
                    and app.conf.task_protocol == 2:
                kwargs.update(_celery_reprs(app, args, kwargs))
            with publishing():
                return _send_sharing(app, send_task, args, kwargs)
        except HeldElsewhere as held:  # a unique task's copy holds its lock: nothing sent
            # in a canvas, its result is REVOKED so that nothing waits for it for ever
            bulk_publish.revoke_in_canvas(app, kwargs.get("task_id"),
                                          args[0] if args else kwargs.get("name"),
                                          held.holder, kwargs)
            return app.AsyncResult(held.holder)
        finally:
            bulk.leave(batched)
            publisher.unmark_publishing(token)

    app.send_task = send_task_marked  # type: ignore[method-assign]


def _celery_reprs(app: Celery, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, str]:
    """Celery's ``argsrepr``/``kwargsrepr`` of large arguments, made cheaply
    (:func:`~jobbers_celery.worker.taskrepr.celery_reprs`); none (Celery makes them) if
    that fails: it never fails a publish."""
    try:
        return taskrepr.celery_reprs(app, args[1] if len(args) > 1 else kwargs.get("args"),
                                     args[2] if len(args) > 2 else kwargs.get("kwargs"))
    except Exception:
        log.debug("Celery makes the reprs of this publish", exc_info=True)
        return {}


def _send_sharing(app: Celery, send_task: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """``send_task`` through a producer of jobbers, which writes the publish's record as
    the message reaches it, the record's payload and the body encoded once
    (:mod:`jobbers_celery.lifecycle.bodyjson`): a group's buffering producer, or the
    app's own wrapped. Not when Celery makes a producer itself (``connection`` given, or
    arguments past ``kwargs`` given by position): the record is written in the signal."""
    if len(args) > 3 or kwargs.get("connection"):
        return send_task(*args, **kwargs)
    producer = kwargs.get("producer") or kwargs.get("publisher")
    if isinstance(producer, bulk_publish.BufferingProducer):
        return _sharing(send_task, args, kwargs)
    with app.producer_or_acquire(producer) as real:
        return _sharing(send_task, args,
                        {**kwargs, "producer": bodyjson.SharingProducer(real)})


def _sharing(send_task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    slot = bodyjson.open_slot()
    sent = False
    try:
        result = send_task(*args, **kwargs)
        sent = True
        return result
    finally:
        bodyjson.close(slot, sent=sent)


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

    ``jobbers_cleaner_queue`` sends it to a queue of its own (the entry's ``options``, which
    django-celery-beat copies too: a backlog on the default queue never holds a pass back).
    It sends no task events (``send_events=False``): monitors such as Flower list no pass,
    where an every-10-seconds task would crowd out the application's tasks.
    """
    queue = config.cleaner_queue
    routing: dict[str, Any] = {"queue": queue} if queue else {}

    @app.task(name=CLEANER_TASK, ignore_result=True, shared=False,
              expires=config.cleaner_interval, send_events=False)
    def clean() -> dict[str, Any]:
        return Jobbers.of(app).cleaner.run(by="beat").as_dict()

    schedule = dict(app.conf.beat_schedule or {})
    entry: dict[str, Any] = {"task": CLEANER_TASK, "schedule": config.cleaner_interval}
    if routing:
        entry["options"] = routing
    schedule.setdefault(CLEANER_TASK, entry)
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
