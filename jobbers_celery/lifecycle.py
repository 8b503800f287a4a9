"""Turns what happens to a task into store steps and dead letters.

Used by the task base class (outcomes), the signal handlers (publish, main-process failures,
unknown tasks), the request class (version mismatch) and the scheduler. Nothing here decides
an outcome; it records the one that was decided.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from jobbers_celery import payload as pl
from jobbers_celery.records import DeadLetter, from_ms
from jobbers_celery.states import TaskState

if TYPE_CHECKING:
    from jobbers_celery.jobbers import Jobbers
    from jobbers_celery.store import StepResult

__all__ = [
    "dead_letter",
    "dead_letter_entry",
    "error_fields",
    "internal_publish",
    "on_publish",
    "unrecorded_publish",
]

log = logging.getLogger("jobbers.lifecycle")

S = TaskState

#: Set while jobbers itself publishes a task whose "submitted" step it already recorded
#: (scheduler claims, resubmits): holds the Redis time of that step.
_internal: ContextVar[int | None] = ContextVar("jobbers_internal_publish", default=None)


@contextmanager
def internal_publish(now_ms: int) -> Iterator[None]:
    token = _internal.set(now_ms)
    try:
        yield
    finally:
        _internal.reset(token)


#: Set while a worker gives a message back by publishing it again because the state store
#: is unreachable: the publish neither records nor asks the store anything.
_unrecorded: ContextVar[bool] = ContextVar("jobbers_unrecorded_publish", default=False)


@contextmanager
def unrecorded_publish() -> Iterator[None]:
    token = _unrecorded.set(True)
    try:
        yield
    finally:
        _unrecorded.reset(token)


def on_publish(
    jobbers: Jobbers,
    name: str,
    headers: dict[str, Any],
    body: Any,
    exchange: str | None,
    routing_key: str | None,
    properties: Mapping[str, Any],
    version: int | None,
    dead_letter: bool,
) -> None:
    """Stamp the message headers and record ``unsubmitted -> submitted`` (one round trip).

    ``jobbers_epoch`` is stamped only when the submission is recorded: a worker that finds
    no record for a message carrying it knows the record was removed on purpose.
    """
    task_id = headers.get("id")
    if not task_id:
        return
    headers.setdefault(pl.HEADER_TASK, name)
    if version is not None:
        # a resubmit states the version the task failed with; keep it
        headers.setdefault(pl.HEADER_VERSION, version)
    if dead_letter:
        headers[pl.HEADER_DEAD_LETTER] = 1
    if _unrecorded.get():
        return  # the store is away: the message keeps the headers it was published with
    now = _internal.get()
    epoch: str | None = None
    if now is None:
        payload = pl.from_publish(headers, body, exchange, routing_key, properties)
        if payload is None:
            log.warning("task %s[%s] uses a message protocol jobbers cannot record", name, task_id)
            return
        queue = pl.queue_of(payload["options"])
        fields = {"msg": _encode_payload(payload)}
        if headers.get("retries"):  # absent means 0: every byte of a record counts
            fields["retries"] = str(headers["retries"])
        elif len(fields["msg"]) > jobbers.config.payload_warn_bytes > 0:  # first publish only
            _warn_large_payload(name, task_id, len(fields["msg"]),
                                jobbers.config.payload_warn_bytes)
        create = {"name": name, "queue": queue}
        if dead_letter:
            create["dlq"] = "1"
        if version is not None:
            create["ver"] = str(version)
        result = jobbers.store.step(
            task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,), create=create, set_fields=fields,
            reason="published", name=name,
        )
        now, epoch = result.now_ms, result.epoch  # epoch: None if refused (not recorded)
    else:
        epoch = jobbers.store.epoch(max_age=10.0)
    headers.setdefault(pl.HEADER_ENQUEUED_AT, now)
    headers[pl.HEADER_PUBLISHED_AT] = now
    if epoch:
        headers[pl.HEADER_EPOCH] = epoch


def _warn_large_payload(name: str, task_id: str, size: int, limit: int) -> None:
    log.warning(
        "task %s[%s]: its payload (args, kwargs and publish options) is %d bytes as JSON, "
        "above jobbers_payload_warn_bytes=%d; jobbers stores it once (on the task's record "
        "while the task can run, in its dead-letter entry once dead-lettered) and the broker "
        "holds the message: pass a reference to large data (a key, a path, a URL) instead",
        name, task_id, size, limit)


def _encode_payload(payload: dict[str, Any]) -> str:
    try:
        return pl.dumps(payload)
    except TypeError:
        # Not JSON: keep what a person can read; such a task cannot be republished by jobbers.
        return pl.dumps({"unserializable": True, "args": repr(payload.get("args")),
                         "kwargs": repr(payload.get("kwargs")), "options": {}})


#: Characters of an error message the record keeps (a dead letter keeps all of it): an
#: exception that quotes a big argument must not put another copy of it on the record.
ERROR_MESSAGE_MAX_CHARS = 1024


def error_fields(exc: BaseException | None, message: str | None = None) -> dict[str, str]:
    if exc is None:
        return {"err": pl.dumps({"type": "", "message": _clip(message or "")})}
    type_name, text, _ = pl.describe_exception(exc)
    return {"err": pl.dumps({"type": type_name, "message": _clip(message or text)})}


def _clip(text: str) -> str:
    if len(text) <= ERROR_MESSAGE_MAX_CHARS:
        return text
    return f"{text[:ERROR_MESSAGE_MAX_CHARS]}... [cut: {len(text)} characters in all]"


def dead_letter(
    jobbers: Jobbers,
    *,
    task_id: str,
    name: str,
    reason: str,
    result: StepResult,
    raw: Mapping[str, str],
    exc: BaseException | None = None,
    message: str | None = None,
    traceback: str | None = None,
    worker: str | None = None,
) -> None:
    """Write the dead letter of a task that just entered a terminal failure state.

    ``raw`` holds the record fields the step returned (``msg``, ``ver``, ``queue``,
    ``retries``, ``ckpt``) so that no extra read is needed.
    """
    jobbers.dead_letters.send(dead_letter_entry(
        task_id=task_id, name=name, reason=reason, result=result, raw=raw, exc=exc,
        message=message, traceback=traceback, worker=worker,
    ))


def dead_letter_entry(
    *,
    task_id: str,
    name: str,
    reason: str,
    result: StepResult,
    raw: Mapping[str, str],
    exc: BaseException | None = None,
    message: str | None = None,
    traceback: str | None = None,
    worker: str | None = None,
) -> DeadLetter:
    """Build, without sending it, the entry :func:`dead_letter` writes (same arguments
    but ``jobbers``); for callers that send many at once (``DeadLetterDispatcher.send_many``).
    """
    payload: dict[str, Any] = {}
    if raw.get("msg"):
        try:
            payload = pl.loads(raw["msg"])
        except ValueError:
            payload = {}
    exc_type = exc_message = None
    if exc is not None:
        exc_type, exc_message, tb_text = pl.describe_exception(exc)
        traceback = traceback or tb_text
    elif message:
        exc_message = message
    checkpoint = None
    if raw.get("ckpt"):
        try:
            checkpoint = pl.loads(raw["ckpt"])
        except ValueError:
            checkpoint = raw["ckpt"]
    args = payload.get("args")
    kwargs = payload.get("kwargs")
    return DeadLetter(
        task_id=task_id,
        name=name,
        version=int(raw["ver"]) if raw.get("ver") else None,
        queue=raw.get("queue") or None,
        reason=reason,
        args=args if isinstance(args, list) else [],
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        exception_type=exc_type,
        exception_message=exc_message,
        traceback=traceback,
        attempt=result.attempt,
        retry_attempt=int(raw.get("retries") or 0),
        worker=worker,
        failed_at=from_ms(result.now_ms),  # type: ignore[arg-type]
        checkpoint=checkpoint,
        options=payload.get("options") or {},
    )


#: Record fields a failing step returns, for the dead letter.
DEAD_LETTER_FIELDS = ("msg", "ver", "queue", "retries", "ckpt", "dlq", "name")
