"""``heartbeat()``: what it keeps between calls, and what it sends past the throttle.

A throttled ``heartbeat()`` call must cost next to nothing (a tight loop may call it on every
iteration), so it keeps the progress and checkpoint as passed, copied or encoded only when
that is cheap or needed, and reads the task's request without ``Task.request``'s cost. The
throttle itself is the first lines of ``JobbersTask.heartbeat`` (:mod:`jobbers_celery.worker.task`);
the rest is here: the bookkeeping (:class:`Beat`, :func:`snapshot`) and :class:`Heartbeats`,
which sends a heartbeat and hands what throttled calls left pending to the attempt's outcome.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobbers_celery.core import softlimit
from jobbers_celery.core.errors import AttemptSuperseded, CheckpointTooLarge, TaskCancelled
from jobbers_celery.core.options import ShutdownPolicy, TaskOptions
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.lifecycle import payload
from jobbers_celery.worker import shutdown
from jobbers_celery.worker.shutdown import WorkerShuttingDown

if TYPE_CHECKING:
    from jobbers_celery.store import RunningStore

__all__ = ["BEAT", "CHECKPOINT", "CHECKPOINT_MAX_BYTES", "DONE", "HEARTBEAT_MIN_GAP_S",
           "IMMUTABLE", "PROGRESS_MAX_BYTES", "Beat", "Encoded", "Heartbeats", "check",
           "encode", "encoded", "new_beat", "pending", "request_getter", "snapshot"]

log = escaped_logger("jobbers.task")

#: Encoded size limits of what ``heartbeat()`` stores on the record.
CHECKPOINT_MAX_BYTES = 64 * 1024
PROGRESS_MAX_BYTES = 16 * 1024
#: A heartbeat is sent at most this often per task (more often only if
#: ``max_heartbeat_interval`` is short: then four times per interval).
HEARTBEAT_MIN_GAP_S = 1.0

#: Request attributes of a running attempt: its heartbeat state (a :class:`Beat`), the
#: checkpoint ``self.checkpoint`` reads, and whether its outcome is recorded (nothing it
#: reports after that would be accepted).
BEAT = "jobbers_heartbeat"
CHECKPOINT = "jobbers_checkpoint"
DONE = "jobbers_outcome_recorded"


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


def new_beat(opts: TaskOptions) -> Beat:
    """The heartbeat state of an attempt of a task with ``opts``, at its first call."""
    gap = HEARTBEAT_MIN_GAP_S
    if opts.max_heartbeat_interval:
        gap = min(gap, opts.max_heartbeat_interval / 4)
    return Beat(gap, stops=opts.on_shutdown is not ShutdownPolicy.CONTINUE)


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


def check(progress: Any, checkpoint: Any) -> None:
    """``heartbeat()`` outside a worker records nothing but checks every value it is
    given: task code tested there meets the errors at the call."""
    if progress is not None:
        encode("progress", progress, PROGRESS_MAX_BYTES)
    if checkpoint is not None:
        encode("checkpoint", checkpoint, CHECKPOINT_MAX_BYTES)


class Heartbeats:
    """Sends the heartbeats of an app's tasks past the throttle, and hands what throttled
    calls left pending to an attempt's outcome. Handed the store's heartbeat and
    ``jobbers_worker_lost_after`` (the lease a ``max_concurrent`` task's heartbeat renews)."""

    def __init__(self, store: RunningStore, lost_after: float) -> None:
        self.store = store
        self.lease_ms = int(lost_after * 1000)

    def send(self, req: Any, beat: Beat, name: str, attempt: int, opts: TaskOptions,
             progress: Any, checkpoint: Any) -> None:
        """``heartbeat()`` past the throttle: the first call of an attempt, the first one
        a gap after the last one sent, any call while the worker shuts down (``req`` is
        the attempt's request, ``beat`` its heartbeat state)."""
        if beat.stops and shutdown.draining():
            raise WorkerShuttingDown(f"the worker is shutting down (on_shutdown={opts.on_shutdown})")
        if progress is not None:
            beat.progress = snapshot("progress", progress, PROGRESS_MAX_BYTES)
        if checkpoint is not None:
            beat.ckpt = snapshot("checkpoint", checkpoint, CHECKPOINT_MAX_BYTES)
        now = time.monotonic()
        if now < beat.due:
            if checkpoint is not None:
                setattr(req, CHECKPOINT, checkpoint)
            return
        # Encode what is pending: an invalid value raises here, in the task, and is dropped.
        encoded_progress = encoded_ckpt = None
        if beat.progress is not None:
            try:
                encoded_progress = encoded("progress", beat.progress, PROGRESS_MAX_BYTES)
            except (TypeError, ValueError):
                beat.progress = None
                raise
        if beat.ckpt is not None:
            try:
                encoded_ckpt = encoded("checkpoint", beat.ckpt, CHECKPOINT_MAX_BYTES)
            except (TypeError, ValueError):
                beat.ckpt = None
                raise
        if checkpoint is not None:
            setattr(req, CHECKPOINT, checkpoint)
        with softlimit.shielded(drop=False):
            result = self.store.heartbeat(
                req.id, attempt, progress=encoded_progress, checkpoint=encoded_ckpt,
                name=name, lease_cap_ms=self.lease_ms if opts.max_concurrent else None,
            )
        beat.due = now + beat.gap
        if not result.delivered:  # Redis unreachable: keep it for the next one
            return
        beat.progress = beat.ckpt = None
        if not result.accepted:
            setattr(req, DONE, True)  # nothing this attempt reports would be accepted
            raise AttemptSuperseded(
                f"{name}[{req.id}] attempt {attempt} is no longer the running "
                f"attempt (the task is {result.state}, attempt {result.attempt})")
        if result.cancel_requested:
            raise TaskCancelled(f"{name}[{req.id}] was cancelled")


def pending(req: Any, name: str, attempt: int) -> dict[str, str]:
    """What throttled heartbeats of the attempt of ``req`` left unsent (progress,
    checkpoint), encoded, to save with its outcome. A value that does not encode can no
    longer reach the task: it is logged and left out (the record keeps the last one sent)."""
    beat = getattr(req, BEAT, None)
    if beat is None:
        return {}
    fields: dict[str, str] = {}
    for attr, what, limit in (("progress", "progress", PROGRESS_MAX_BYTES),
                              ("ckpt", "checkpoint", CHECKPOINT_MAX_BYTES)):
        value = getattr(beat, attr)
        if value is None:
            continue
        try:
            text = encoded(what, value, limit)
        except (TypeError, ValueError) as exc:
            setattr(beat, attr, None)
            log.error("%s[%s] attempt %s: the %s its last heartbeat() left unsent is not "
                      "saved with its outcome: %s", name, req.id, attempt, what, exc)
            continue
        fields[attr] = text  # the record's fields: progress, ckpt
        setattr(beat, attr, Encoded(text))  # the step may be sent again: encode once
    return fields
