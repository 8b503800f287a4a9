"""A unique task's publish (see :mod:`jobbers_celery.core.unique`): the lock travels in a
header to the publish's ``submitted`` step, which takes it in the same store call (one
Redis) or right before it (sharded layout). A step refused because another copy holds the
lock raises :class:`HeldElsewhere` through the publish, so no message goes; the app's
``send_task`` (wrapped by ``install``) turns it into the holder's ``AsyncResult``, and
``apply_async`` raises :class:`~jobbers_celery.core.unique.DuplicateTask` instead when the
task asks for that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobbers_celery.core.unique import (
    HEADER_UNIQUE,
    DuplicateTask,
    HeldElsewhere,
    Unique,
    field_value,
    key_digest,
    validate_unique,
)

if TYPE_CHECKING:
    from celery import Task

__all__ = ["HeldElsewhere", "prepare", "settle"]

#: The option a publish passes to override its task's ``unique`` (a ``Unique``, or
#: ``False`` for none).
OPTION = "unique"


def prepare(task: Task[Any, Any], args: Any, kwargs: Any, options: dict[str, Any]
            ) -> Unique | None:
    """For a publish of ``task``: pop the per-call ``unique`` option and, when the publish
    is unique, put its lock in the message headers (``options["headers"]``, a copy).
    Returns the spec applied, ``None`` for a publish that is not unique. Raises
    :class:`~jobbers_celery.core.unique.UniqueKeyError` (a key it cannot make) and
    :class:`~jobbers_celery.core.errors.InvalidTaskOption` (a bad per-call value)."""
    if OPTION in options:
        spec = validate_unique(options.pop(OPTION), "apply_async(unique=...)")
    else:
        spec = getattr(getattr(task, "jobbers_options", None), "unique", None)
    if spec is None:
        return None
    headers = dict(options.get("headers") or {})
    if HEADER_UNIQUE in headers:  # a republish of a recorded copy: its lock is its own
        return None
    digest = key_digest(task.name, spec, args, kwargs, getattr(task, "run", None))
    headers[HEADER_UNIQUE] = field_value(spec, digest)
    options["headers"] = headers
    return spec


def settle(task: Task[Any, Any], spec: Unique, task_id: str, result: Any) -> Any:
    """The publish's answer: ``result`` (the task's own, or the holder's when a copy held
    the lock), or :class:`DuplicateTask` raised if ``spec`` asks for it."""
    holder = getattr(result, "id", task_id)
    if holder != task_id and spec.raise_duplicate:
        raise DuplicateTask(task.name, str(holder))
    return result
