"""The dead-letter entry: built from the record fields the failing step returned.

No read of its own: the step that ended the task returns :data:`DEAD_LETTER_FIELDS`, and the
entry is made from them (the payload, the checkpoint, the version, the queue), with the
task's exception cut and redacted, and its arguments sealed when payload keys are set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobbers_celery.core import errortext
from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.records import UNPUBLISHABLE, DeadLetter, from_ms
from jobbers_celery.deadletter import payloadjson as pl
from jobbers_celery.deadletter.errors import describe_exception, describe_traceback
from jobbers_celery.store import StepResult

__all__ = ["DEAD_LETTER_FIELDS", "dead_letter_entry"]

#: Record fields a failing step returns, for the dead letter.
DEAD_LETTER_FIELDS = ("msg", "ver", "queue", "retries", "ckpt", "dlq", "name")


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
    codec: PayloadCodec | None = None,
) -> DeadLetter:
    """The dead-letter entry of a task whose step ``result`` returned the record fields
    ``raw`` (``msg``, ``ver``, ``queue``, ``retries``, ``ckpt``). With ``codec`` (payload
    keys set), its arguments are sealed: as the record holds them, or sealed here when
    the record holds them in clear (published by a process without the keys), so that every
    place the entry goes (sink, outbox, spool) keeps them sealed."""
    payload: dict[str, Any] = {}
    if raw.get("msg"):
        try:
            payload = pl.loads(raw["msg"])
        except ValueError:
            payload = {}
    exc_type = exc_message = None
    if exc is not None:
        exc_type, exc_message, tb_text = describe_exception(exc)
        traceback = describe_traceback(traceback) if traceback else tb_text
    elif message:
        exc_message = errortext.cut_message(message)
    checkpoint = None
    if raw.get("ckpt"):
        try:
            checkpoint = pl.loads(raw["ckpt"])
        except ValueError:
            checkpoint = raw["ckpt"]
    args = payload.get("args")
    kwargs = payload.get("kwargs")
    args = args if isinstance(args, list) else []
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if codec is not None and codec.enabled and not pl.sealed_arguments(args, kwargs):
        sealed = pl.seal_arguments({"args": args, "kwargs": kwargs}, codec, stored=True)
        args, kwargs = sealed["args"], sealed["kwargs"]
    options = payload.get("options") or {}
    if payload.get("unserializable") or not raw.get("msg"):
        # nothing jobbers can publish again: say so, rather than resubmit it without arguments
        options = {UNPUBLISHABLE: "its arguments were not recorded as JSON"
                   if raw.get("msg") else "no arguments were recorded"}
    return DeadLetter(
        task_id=task_id,
        name=name,
        version=int(raw["ver"]) if raw.get("ver") else None,
        queue=raw.get("queue") or None,
        reason=reason,
        args=args,
        kwargs=kwargs,
        exception_type=exc_type,
        exception_message=exc_message,
        traceback=traceback,
        attempt=result.attempt,
        retry_attempt=int(raw.get("retries") or 0),
        worker=worker,
        failed_at=from_ms(result.now_ms),  # type: ignore[arg-type]
        checkpoint=checkpoint,
        options=options,
    )
