"""What ``heartbeat()`` keeps between calls: the values of one running attempt.

A throttled ``heartbeat()`` call must cost next to nothing (a tight loop may call it on every
iteration), so it keeps the progress and checkpoint as passed, copied or encoded only when
that is cheap or needed, and reads the task's request without ``Task.request``'s cost. These
helpers are that bookkeeping, apart from the task class (:mod:`jobbers_celery.worker.task`), which
decides when a heartbeat is sent and what follows.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from jobbers_celery.core.errors import CheckpointTooLarge
from jobbers_celery.lifecycle import payload

__all__ = ["CHECKPOINT_MAX_BYTES", "IMMUTABLE", "PROGRESS_MAX_BYTES", "Beat", "Encoded",
           "encode", "encoded", "request_getter", "snapshot"]

#: Encoded size limits of what ``heartbeat()`` stores on the record.
CHECKPOINT_MAX_BYTES = 64 * 1024
PROGRESS_MAX_BYTES = 16 * 1024


class Beat:
    """The heartbeat state of one running attempt, kept on its request: when the next
    heartbeat may be sent, and the values throttled calls left to send with it."""

    __slots__ = ("ckpt", "due", "gap", "progress", "stops")

    def __init__(self, gap: float, stops: bool) -> None:
        self.due = -math.inf  # calls before this monotonic time are throttled: not the first
        self.gap = gap
        self.stops = stops  # on_shutdown is stop or resubmit: a shutdown raises at a call
        self.progress: Any = None  # pending, not sent yet: see snapshot; None: nothing
        self.ckpt: Any = None


class Encoded:
    """A pending heartbeat value already encoded as JSON (to tell it from a string value)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


#: Types whose values cannot change after ``heartbeat()`` returns: kept as passed.
IMMUTABLE = frozenset({int, float, str, bool, type(None)})


def snapshot(what: str, value: Any, limit: int) -> Any:
    """The value ``heartbeat()`` keeps until it is sent: the value as passed, even if the
    task changes it after the call. A number, string or ``None`` is kept as it is; a dict,
    list or tuple of those is copied (one level, cheap); anything else is encoded now (and
    so checked now)."""
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:
        for item in value.values() if kind is dict else value:
            if type(item) not in IMMUTABLE:
                break
        else:  # numbers and strings only: a shallow copy is the value as passed
            return value if kind is tuple else value.copy()
    elif kind in IMMUTABLE:
        return value
    return Encoded(encode(what, value, limit))


def encoded(what: str, value: Any, limit: int) -> str:
    """A pending value (not ``None``) as JSON."""
    if type(value) is Encoded:
        return value.text
    return encode(what, value, limit)


def request_getter(stack: Any) -> Callable[[], Any]:
    """A function returning the top of Celery's request ``stack`` in this thread (the
    request the task runs under), or ``None``: ``stack.top``, at a fraction of its cost.

    ``Task.request`` reads the stack through ``celery.utils.threads.Local``, whose every
    read costs ~0.7 us (a failed attribute lookup, then ``__getattr__``): more than the
    whole throttled heartbeat. For the stack Celery uses by default this reads the same
    storage directly. With any other stack (``USE_FAST_LOCALS``, another Celery version)
    it is the public ``stack.top``. ``heartbeat()`` checks the result against
    ``self.request`` once per attempt and falls back to ``stack.top`` should they differ.
    """
    threads = importlib.import_module("celery.utils.threads")
    local = getattr(stack, "_local", None)
    storage = getattr(local, "__storage__", None) if local is not None else None
    ident = getattr(local, "__ident_func__", None) if local is not None else None
    if (type(stack) is getattr(threads, "_LocalStack", None)
            and type(local) is getattr(threads, "Local", None)
            and type(storage) is dict and callable(ident)):

        def top() -> Any:
            try:
                return storage[ident()]["stack"][-1]
            except (KeyError, IndexError):
                return None

        return top
    return lambda: stack.top


def encode(what: str, value: Any, limit: int) -> str:
    try:
        text = payload.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"heartbeat {what} must be JSON-serializable: {exc}") from exc
    size = len(text.encode())
    if size > limit:
        raise CheckpointTooLarge(
            f"heartbeat {what} is {size} bytes as JSON; the limit is {limit} bytes: store "
            f"large state elsewhere and checkpoint a reference to it")
    return text
