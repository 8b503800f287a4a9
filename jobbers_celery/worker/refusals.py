"""Messages a worker refuses before running them end ``dropped``, never ``submitted`` forever.

Celery's consumer refuses a message before any task code runs when its content type is not
in ``accept_content`` (kombu's ``ContentDisallowed``, e.g. a pickle message to a JSON-only
worker), when it is not a valid task message (``InvalidTaskError``, or no ``task`` header)
or when its body cannot be decoded (``DecodeError``). It logs, acknowledges or rejects the
message, and nothing else: the record stays ``submitted`` and the cleaner, which only looks
at started tasks, never ends it. Here the record ends ``dropped`` with the reason, and the
task's dead-letter policy applies, through Celery's own extension points:

- ``task_rejected`` (sent by ``Consumer.on_invalid_task`` and ``Consumer.on_unknown_message``);
- :class:`RefusalStep`, a consumer bootstep wrapping ``Consumer.on_decode_error``, which
  sends no signal.

Only the message's headers are read (task id, name and the ``jobbers_*`` headers): on the
Redis transport they are JSON in the envelope, on AMQP table fields, so the body, an
unsafe payload, is never deserialised. The dead letter carries the arguments the publishing
client recorded as JSON (``before_task_publish``), or, when none were recorded as JSON,
none, and is then marked unpublishable (:data:`jobbers_celery.core.records.UNPUBLISHABLE`). A
refused message of a ``JobbersTask`` that has no record (a client without jobbers) is
recorded as it is dropped, without arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import bootsteps, signals
from kombu.exceptions import ContentDisallowed, DecodeError

from jobbers_celery.core.errortext import cut_head
from jobbers_celery.core.intake import MAX_NAME_CHARS, identity_over_limits
from jobbers_celery.core.options import DeadLetterPolicy, TaskOptions
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle.payload import (
    HEADER_DEAD_LETTER,
    HEADER_ENQUEUED_AT,
    HEADER_EPOCH,
    HEADER_TASK,
    HEADER_VERSION,
)
from jobbers_celery.lifecycle.payload import dumps as _dumps
from jobbers_celery.store import StepResult, StepStore
from jobbers_celery.telemetry import metrics
from jobbers_celery.worker.request import OverLimits

__all__ = ["MessageRefused", "RefusalStep", "connect_refusals", "on_task_rejected",
           "record_refusal", "refusal_reason"]

log = escaped_logger("jobbers.refusals")

#: Characters of a decoder's error message kept in the reason (a decoder may quote the body).
_DETAIL_MAX = 200

#: The payload recorded for a refused message that had no record: its body is not read, so
#: there is nothing to publish again (its dead letter says so).
NOT_READ = _dumps({"unserializable": True, "args": "(not read: the worker refused the message)",
                   "kwargs": "", "options": {}})


class MessageRefused(Exception):
    """The worker refused the message before running it (the record's error type)."""


def refusal_reason(message: Any, exc: BaseException | None) -> str:
    """Why the worker refused ``message``, in words an operator acts on."""
    content_type = getattr(message, "content_type", None) or "(none)"
    if isinstance(exc, ContentDisallowed):
        return f"content type {content_type} is not accepted by this worker (accept_content)"
    if isinstance(exc, DecodeError):
        detail = str(exc)[:_DETAIL_MAX]
        return f"the message body could not be decoded as {content_type}: {detail}"
    if exc is None:
        return "not a task message this worker can run (no 'task' header)"
    if isinstance(exc, OverLimits):
        return f"over the worker's intake limits: {exc}"
    return f"not a valid task message: {type(exc).__name__}: {str(exc)[:_DETAIL_MAX]}"


def _headers(message: Any) -> Mapping[str, Any]:
    headers = getattr(message, "headers", None)
    return headers if isinstance(headers, Mapping) else {}


def record_refusal(consumer: Any, message: Any, exc: BaseException | None) -> None:
    """Record the drop of a refused ``message`` (from its headers only). Never raises: it
    runs inside Celery's consumer."""
    try:
        _record(consumer, message, exc)
    except Exception:
        log.exception("could not record a refused message")


def _record(consumer: Any, message: Any, exc: BaseException | None) -> None:
    headers = _headers(message)
    task_id = headers.get("id")
    name = headers.get("task") or headers.get(HEADER_TASK)
    if not isinstance(task_id, str) or not isinstance(name, str) or not task_id:
        return  # nothing names a task to end (protocol 1 keeps them in the body: not read)
    # an over-long id or name, or one with a lone surrogate, is never made a key (not at
    # publish, nor late here)
    too_long = identity_over_limits(task_id, name)
    name = cut_head(name, MAX_NAME_CHARS)
    app = getattr(consumer, "app", None)
    jobbers = Jobbers.find(app)
    if jobbers is None:
        return
    task = app.tasks.get(name) if app is not None else None
    opts = getattr(task, "jobbers_options", None)
    if isinstance(opts, TaskOptions):
        dead_letter = opts.dead_letter_policy is DeadLetterPolicy.SAVE
    elif HEADER_TASK in headers:  # tracked by its publisher, not a JobbersTask here
        dead_letter = bool(headers.get(HEADER_DEAD_LETTER))
    else:
        return  # neither tracked nor a JobbersTask: not jobbers' to record
    reason = refusal_reason(message, exc)
    log.warning("dropping refused message %s[%s]: %s", name, cut_head(task_id, 200), reason)

    recorder, store = jobbers.recorder, jobbers.store

    def drop() -> StepResult:
        return recorder.drop(
            task_id, name, reason=f"refused by the worker: {reason}",
            worker=getattr(consumer, "hostname", None), exc=MessageRefused(reason),
            enqueued_ms=metrics.ms_value(headers.get(HEADER_ENQUEUED_AT)),
            dead_letter=dead_letter,
        )

    if too_long:  # recorder.publish never records such an id or name: no record to end
        log.error("refused message %s[%s] not recorded: %s", cut_head(name, 200),
                  cut_head(task_id, 200), too_long)
        return
    res = drop()
    if not res.applied and res.previous == "missing" and isinstance(opts, TaskOptions) \
            and not _removed_on_purpose(store, task_id, headers):
        # Published without a record (by a client without jobbers, or while the store was
        # away): record the submission now, with no arguments (the body is not read), and
        # drop it, so that the refusal is seen and dead-lettered like any other.
        recorder.late_submit(
            task_id, name, _int(headers.get(HEADER_VERSION), opts.version),
            str((getattr(message, "delivery_info", None) or {}).get("routing_key") or ""),
            dead_letter, NOT_READ, _int(headers.get("retries"), 0))
        res = drop()
    if not res.applied:
        log.info("refused message %s[%s] not recorded as dropped: the task is %s", name,
                 task_id, res.previous)


def _removed_on_purpose(store: StepStore, task_id: str, headers: Mapping[str, Any]) -> bool:
    """The message's submission was recorded in the current dataset, and its record is
    gone: removed on purpose (purged, expired), not to be recorded again."""
    epoch = headers.get(HEADER_EPOCH)
    return bool(epoch) and epoch == store.epoch(task_id)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def on_task_rejected(sender: Any = None, message: Any = None, exc: BaseException | None = None,
                     **_: Any) -> None:
    """``task_rejected``: sent by the consumer for an invalid task message (``exc`` is
    ``InvalidTaskError`` or ``ContentDisallowed``) or one without a ``task`` header
    (``exc`` is ``None``)."""
    record_refusal(sender, message, exc)


class RefusalStep(bootsteps.Step):
    """Consumer bootstep: a body that cannot be decoded ends ``dropped`` too.

    ``Consumer.on_decode_error`` logs and acknowledges the message and sends no signal. The
    handler is looked up on the consumer when it is called (and handed to kombu's consumer
    when the ``Tasks`` step starts, after this step is built), so replacing the attribute
    here is enough."""

    label = "jobbers refused messages"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        celery_handler = parent.on_decode_error

        def on_decode_error(message: Any, exc: BaseException) -> None:
            celery_handler(message, exc)
            record_refusal(parent, message, exc)

        parent.on_decode_error = on_decode_error


def connect_refusals() -> None:
    """Connect the ``task_rejected`` handler once per process (``dispatch_uid``)."""
    signals.task_rejected.connect(on_task_rejected, weak=False,
                                  dispatch_uid="jobbers.task_rejected")
