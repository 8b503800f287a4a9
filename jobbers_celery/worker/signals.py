"""Signal handlers. They only record: Celery swallows their exceptions, so no decision
that changes a task's outcome is made here (those live in :class:`JobbersTask`).

- ``before_task_publish`` (every publishing process): redact ``argsrepr``/``kwargsrepr``
  (:mod:`jobbers_celery.worker.taskrepr`), stamp headers, record ``submitted``.
- ``task_success`` and ``task_failure`` in the process that ran the task, for a result
  Celery's tracer stores itself (not folded into the ``completed`` step): the task records
  its completion once the result is stored, or ``failed`` when it could not be.
- ``task_failure`` in the worker's main process (lost pool child, rejected message, hard
  time limit): record ``failed``; in the pool the task class has already recorded it.
- ``task_unknown`` (main process): no worker has this name, record ``dropped``.
- ``task_prerun`` for a tracked message that reaches a plain (non-jobbers) task: ``dropped``
  with the reason, so the record does not claim a state nobody will move it out of.
- ``task_revoked`` (main process; Celery's own revoke, or ``cancel(terminate=True)``
  interrupting a task): ``cancelled``. Not for the announcement of a cancellation jobbers
  recorded itself (see :mod:`jobbers_celery.worker.request`).
- ``worker_init`` (main process, before the pool forks): make the worker incarnation id;
  the worker's lifecycle steps wait out a store outage (up to ``jobbers_worker_lost_after``).
- ``worker_shutting_down`` (signal-handler context): set the draining flag (see shutdown);
  ``worker_init`` clears it (a process may start another worker after one stopped).
- ``worker_shutdown`` (main process) and ``worker_process_shutdown`` (pool children, which
  exit without running ``atexit``): dead letters kept only in memory go to the sink or
  somewhere durable if they can (:func:`jobbers_celery.deadletter.dispatcher.close_all`);
  alerts still queued get up to 2 s to be delivered
  (:func:`jobbers_celery.alerts.service.flush_all`).
"""

from __future__ import annotations

from typing import Any

from celery import signals
from celery._state import get_current_app

from jobbers_celery.alerts import service as alert_service
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.errortext import cut_head
from jobbers_celery.core.intake import MAX_NAME_CHARS
from jobbers_celery.core.options import DeadLetterPolicy
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.deadletter import dispatcher
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import bulk, liveness, results
from jobbers_celery.lifecycle.payload import (
    HEADER_DEAD_LETTER,
    HEADER_ENQUEUED_AT,
    HEADER_TASK,
    request_header,
    workflow_of,
)
from jobbers_celery.lifecycle.publisher import publishing_app
from jobbers_celery.lifecycle.recorder import Recorder
from jobbers_celery.store import HousekeepingStore
from jobbers_celery.telemetry import metrics
from jobbers_celery.worker import shutdown, taskrepr
from jobbers_celery.worker.hooks import connect_each
from jobbers_celery.worker.task import JobbersTask

__all__ = ["connect"]

log = escaped_logger("jobbers.signals")


def _for_publish(name: str) -> tuple[Jobbers | None, JobbersTask | None]:
    """Which installed jobbers records a publish of ``name``, and the task if known: that
    of the app publishing it (``install`` marks ``app.send_task``), else the first app that
    registers the name."""
    sender = publishing_app()
    if sender is not None:
        jobbers = Jobbers.find(sender)  # the installed one of the app (no list sorted)
        if jobbers is not None:
            task = sender.tasks.get(name)
            if task is None or isinstance(task, JobbersTask):
                return jobbers, task
            return None, None
    candidates = Jobbers.installed()
    for jobbers in candidates:
        app: Any = jobbers.app  # (finalized, autofinalize, _tasks: not in the stubs)
        # an app made with autofinalize=False is not finalized by another app's publish
        # (``app.tasks`` would, or raise): its registry as Celery's send_task reads it
        registry = app._tasks if not (app.finalized or app.autofinalize) else app.tasks
        task = registry.get(name)
        if task is not None:
            return (jobbers, task) if isinstance(task, JobbersTask) else (None, None)
    # Unknown here (``send_task`` by name): track it so that a worker lacking it drops it.
    current = get_current_app()  # the app itself: ``celery.current_app`` is a proxy
    for jobbers in candidates:
        if jobbers.app is current:
            return jobbers, None
    return (candidates[0], None) if candidates else (None, None)


def on_before_publish(
    sender: str | None = None,
    body: Any = None,
    exchange: str | None = None,
    routing_key: str | None = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    if not sender or headers is None:
        return
    jobbers, task = _for_publish(sender)
    if jobbers is None:
        return
    try:  # what logs and task events show; the body keeps the real values
        taskrepr.redact_headers(jobbers.app, task, headers, body,
                                taskrepr.redactor_of(jobbers.config))
    except Exception:
        log.exception("could not redact the argsrepr of %s[%s]", sender, headers.get("id"))
    if properties is not None:
        # Celery copies apply_async's leftover options into the message's properties: a
        # repr passed to it (jobbers' own, taskrepr.celery_reprs) would travel there as
        # given, unredacted; the headers carry it
        properties.pop("argsrepr", None)
        properties.pop("kwargsrepr", None)
    opts = getattr(task, "jobbers_options", None)
    recorder = jobbers.recorder
    try:
        recorder.publish(
            sender, headers, body, exchange, routing_key, properties or {},
            version=opts.version if opts else None,
            dead_letter=bool(opts and opts.dead_letter_policy is DeadLetterPolicy.SAVE),
            workflow=workflow_of(jobbers.app, headers, body),
            batch=bulk.current(),  # a group's member: written with the group's others
        )
    except Exception:
        # The message still goes out; the worker records the submission when it starts.
        log.exception("could not record the publish of %s[%s]", sender, headers.get("id"))


def on_task_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    einfo: Any = None,
    **_: Any,
) -> None:
    if not isinstance(sender, JobbersTask) or not task_id:
        return
    if getattr(sender.request, "is_eager", False):
        return  # run in the caller (eager, apply()): nothing was recorded, nothing to end
    if sender._storing_result():
        # in the process that ran it: it returned, and Celery could not store its result
        sender._result_not_stored(exception or RuntimeError("its result was not stored"))
        return
    if getattr(sender.request, "jobbers_outcome_recorded", False):
        return  # recorded by the task itself, in the pool
    recorder = _recorder(sender.app)
    if recorder is None:
        return
    try:
        recorder.fail_reported(
            task_id, sender.name, wid=liveness.worker_id(), exc=exception,
            traceback=str(getattr(einfo, "traceback", "") or "") or None,
            worker=getattr(sender.request, "hostname", None),
            # the request is on the task's stack for a lost pool child, not in every case
            enqueued_ms=metrics.ms_value(request_header(sender.request, HEADER_ENQUEUED_AT)),
            dead_letter=sender.jobbers_options.dead_letter_policy is DeadLetterPolicy.SAVE,
        )
    except Exception:
        log.exception("could not record the failure of %s[%s]", sender.name, task_id)


def on_task_success(sender: Any = None, **_: Any) -> None:
    """In the process that ran it, once Celery's tracer stored the result: the completion
    a JobbersTask left to this moment (its result is not folded into the step)."""
    if isinstance(sender, JobbersTask):
        try:
            sender._result_stored()
        except Exception:
            log.exception("could not record the completion of %s[%s]", sender.name,
                          getattr(sender.request, "id", None))


def on_task_unknown(
    sender: Any = None,
    name: str | None = None,
    id: str | None = None,  # Celery's argument name
    message: Any = None,
    **_: Any,
) -> None:
    headers = getattr(message, "headers", None) or {}
    if not id or HEADER_TASK not in headers:
        return
    recorder = _recorder(getattr(sender, "app", None))
    if recorder is None:
        return
    # the name is the publisher's (no task here has it): cut where it is shown (the drop
    # changes a record its publisher made, and never makes one)
    reason = f"no task named {cut_head(repr(name), 200)} is registered on this worker"
    name = cut_head(name or "", MAX_NAME_CHARS)
    try:
        recorder.drop(
            id, name or "", reason=reason, worker=getattr(sender, "hostname", None),
            enqueued_ms=metrics.ms_value(headers.get(HEADER_ENQUEUED_AT)),
            dead_letter=bool(headers.get(HEADER_DEAD_LETTER)),
        )
    except Exception:
        log.exception("could not record the drop of unknown task %s[%s]", name, id)


def on_task_prerun(sender: Any = None, task_id: str | None = None, task: Any = None,
                   **_: Any) -> None:
    if task is None or isinstance(task, JobbersTask) or not task_id:
        return
    if task.request.get(HEADER_TASK) is None:
        return
    recorder = _recorder(task.app)
    if recorder is None:
        return
    reason = f"{task.name} is not a JobbersTask on this worker; it runs untracked"
    try:
        recorder.drop(
            task_id, task.name, reason=reason,
            enqueued_ms=metrics.ms_value(request_header(task.request, HEADER_ENQUEUED_AT)))
    except Exception:
        log.exception("could not record %s[%s]", task.name, task_id)


def on_task_postrun(sender: Any = None, task: Any = None, **_: Any) -> None:
    """After Celery's tracer stored the attempt's outcome: publish the immediate retry the
    attempt recorded, if any (:meth:`JobbersTask.publish_retry` says why it waits until
    now). Should it fail, the record's publish lease has a scheduler publish it later."""
    if not isinstance(task, JobbersTask):
        return
    try:
        task.publish_retry()
    except Exception:
        log.exception("could not publish the retry of %s; a scheduler publishes it when its "
                      "lease expires", task.name)
    try:
        task.release_fair_share()
    except Exception:
        log.exception("could not release the next parked task of %s's key; a scheduler "
                      "pass releases it", task.name)


def on_task_revoked(sender: Any = None, request: Any = None, terminated: bool = False,
                    signum: Any = None, expired: bool = False, **_: Any) -> None:
    task_id = getattr(request, "id", None)
    if not isinstance(sender, JobbersTask) or not task_id:
        return
    if getattr(request, "jobbers_outcome_recorded", False):
        return  # jobbers recorded the cancellation Celery now announces
    recorder = _recorder(sender.app)
    if recorder is None:
        return
    worker = getattr(request, "hostname", None)
    try:
        if terminated:  # usually recorded already by the task itself, on its way out
            recorder.interrupted(
                task_id, sender.name, wid=liveness.worker_id(), signum=signum, worker=worker,
                enqueued_ms=metrics.ms_value(request_header(request, HEADER_ENQUEUED_AT)))
        else:
            recorder.revoked(task_id, worker=worker, expired=bool(expired))
    except Exception:
        log.exception("could not record the revoke of %s[%s]", sender.name, task_id)


def _recorder(app: Any) -> Recorder | None:
    """The recorder of the jobbers installed on ``app``, ``None`` if there is none."""
    jobbers = Jobbers.find(app)
    return None if jobbers is None else jobbers.recorder


def on_worker_init(sender: Any = None, **_: Any) -> None:
    liveness.set_worker_id(getattr(sender, "hostname", None))
    jobbers = Jobbers.find(getattr(sender, "app", None))
    if jobbers is not None:
        store, lost_after = jobbers.store, jobbers.config.worker_lost_after
        try:  # before the wait below: a store down at start must not hold the start up
            store.shards  # noqa: B018 - read the dataset's layout before forking
        except ConfigurationError as exc:  # a wrong jobbers_store_shards: do not start
            log.critical("%s", exc)
            raise SystemExit(f"jobbers: {exc}") from exc
        except Exception:  # unreachable now: read at the first store call instead
            log.warning("could not read the jobbers store's layout at start; it is read at "
                        "the first store call", exc_info=True)
        # a step waits for the store as long as the worker's liveness may be silent
        store.wait_out_outages(lost_after)
        try:
            results.check_layout(store, jobbers.app.backend)
        except Exception:  # a check, never a reason not to start
            log.debug("could not check the result backend layout", exc_info=True)


def on_process_exit(**_: Any) -> None:
    dispatcher.close_all()
    alert_service.flush_all()  # alerts still queued: their daemon thread dies with us


def on_worker_after_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """Once the worker's logging is set up (``worker_init`` comes before it): warn if the
    store evicts."""
    jobbers = Jobbers.find(getattr(instance, "app", None))
    if jobbers is not None:
        check_eviction(jobbers.store)


def check_eviction(store: HousekeepingStore) -> str | None:
    """Warn (once, at worker start) if the store's ``maxmemory-policy`` evicts keys: an
    evicted record loses its task's state and history (and an evicted index entry hides the
    task from the cleaner). Returns the warning, ``None`` if the policy is ``noeviction`` or
    cannot be read (``CONFIG`` and ``INFO`` both refused, Redis unreachable)."""
    try:
        policy = store.maxmemory_policy()
    except Exception:  # a check, never a reason not to start
        log.debug("could not read the store's maxmemory-policy", exc_info=True)
        return None
    if policy is None or policy == "noeviction":
        return None
    message = (f"the jobbers store's Redis has maxmemory-policy {policy}: when it reaches "
               "maxmemory it evicts keys, and an evicted jobbers record loses its task's state "
               "and history (a running task can no longer finish in the record, the cleaner "
               "cannot see it). Set maxmemory-policy noeviction: jobbers then waits while "
               "memory is full, as for an outage (see the Redis settings how-to).")
    log.warning(message)
    return message


def connect() -> None:
    """Connect the handlers once per process (idempotent through ``dispatch_uid``)."""
    connect_each((
        (signals.before_task_publish, on_before_publish, "jobbers.before_task_publish"),
        (signals.task_failure, on_task_failure, "jobbers.task_failure"),
        (signals.task_success, on_task_success, "jobbers.task_success"),
        (signals.task_unknown, on_task_unknown, "jobbers.task_unknown"),
        (signals.task_prerun, on_task_prerun, "jobbers.task_prerun"),
        (signals.task_postrun, on_task_postrun, "jobbers.task_postrun"),
        (signals.task_revoked, on_task_revoked, "jobbers.task_revoked"),
        (signals.worker_init, on_worker_init, "jobbers.worker_init"),
        (signals.celeryd_after_setup, on_worker_after_setup, "jobbers.celeryd_after_setup"),
        (signals.worker_shutting_down, shutdown.on_worker_shutting_down,
         "jobbers.worker_shutting_down"),
        (signals.worker_init, shutdown.on_worker_init, "jobbers.shutdown.worker_init"),
        (signals.worker_shutdown, on_process_exit, "jobbers.dead_letters.worker_shutdown"),
        (signals.worker_process_shutdown, on_process_exit,
         "jobbers.dead_letters.process_shutdown"),
    ))
