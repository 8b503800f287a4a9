"""The heartbeat side of :class:`~jobbers_celery.worker.task.JobbersTask`: what a task body
calls while it runs (``heartbeat()``, ``self.checkpoint``), as a mixin.

``heartbeat()`` holds the throttle itself, its hot path: a call inside the gap decides with
one request lookup, one attribute and one clock read, and encodes nothing. A call past it
goes to the heartbeat collaborator (:mod:`~jobbers_celery.worker.heartbeat`), which sends.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from jobbers_celery.worker import heartbeat as hb
from jobbers_celery.worker import shutdown
from jobbers_celery.worker.heartbeat import (
    CHECKPOINT_MAX_BYTES,
    IMMUTABLE,
    PROGRESS_MAX_BYTES,
    request_getter,
    snapshot,
)
from jobbers_celery.worker.taskbase import TaskBase

_CHECKPOINT = hb.CHECKPOINT
_HB = hb.BEAT  # the attempt's heartbeat state, a heartbeat.Beat


class HeartbeatMixin(TaskBase):
    """``heartbeat()`` and ``checkpoint`` of a JobbersTask."""

    @property
    def checkpoint(self) -> Any:
        """What an earlier attempt saved with ``heartbeat(checkpoint=...)``, or ``None``."""
        return getattr(self.request, _CHECKPOINT, None)

    def heartbeat(self, progress: Any = None, checkpoint: Any = None) -> None:
        """Tell jobbers this attempt is alive; optionally record progress and a checkpoint.

        One Redis round trip, throttled: a call less than ``HEARTBEAT_MIN_GAP_S`` (1 s, or
        a quarter of ``max_heartbeat_interval`` when that is shorter) after the last one
        sent is not sent; its progress and checkpoint are kept and go out with the next one
        sent, or with the task's completion, retry or failure. A throttled call decides
        first and encodes nothing: a tight loop may call it on every iteration. ``progress``
        (JSON, at most 16 KiB) shows on the record; ``checkpoint`` (JSON, at most 64 KiB)
        is what ``self.checkpoint`` holds in the next attempt. ``None`` leaves either
        unchanged. What is kept is the value as passed, even if the task changes a dict or
        list after the call: a number or string, or a dict, list or tuple of those, is kept
        (copied, one level); anything else is encoded at the call.

        A value that is not JSON-serializable raises ``TypeError``, one over its size limit
        :class:`CheckpointTooLarge`. Outside a worker (called directly, eager) every call
        checks both, so task code tested there meets these errors at the call. In a worker a
        value is checked when it is encoded: one kept as passed when it is sent (at the call
        that passed it if that call is sent, the first of an attempt always is; otherwise the
        next call sent raises the error), anything else at the call. A value replaced by a
        later call before it was sent is never checked (it would never be stored). One still
        pending when the task ends is checked then; if invalid it is not saved and an error
        is logged (the record keeps the last value sent), as the task can no longer be told.

        Raises :class:`TaskCancelled` if the task was cancelled,
        :class:`AttemptSuperseded` if this attempt was declared stalled meanwhile, and
        :class:`~jobbers_celery.worker.shutdown.WorkerShuttingDown` when the worker (threads or
        solo pool) shuts down and ``on_shutdown`` is ``stop`` or ``resubmit`` (checked on
        every call, throttled or not). If Redis cannot be reached the heartbeat is logged
        and kept for the next one; the task goes on. Call it from the task's own thread.
        Outside a worker it records nothing.
        """
        # The hot path: a throttled call keeps its values and returns. One cheap request
        # lookup (_request_top), one attribute, one clock read; nothing is encoded.
        req = self._request_top()
        beat = getattr(req, _HB, None)
        if (beat is not None and time.monotonic() < beat.due
                and not (beat.stops and shutdown.draining())):
            if progress is not None:
                beat.progress = (progress if type(progress) in IMMUTABLE
                                 else snapshot("progress", progress, PROGRESS_MAX_BYTES))
            if checkpoint is not None:
                beat.ckpt = (checkpoint if type(checkpoint) in IMMUTABLE
                             else snapshot("checkpoint", checkpoint, CHECKPOINT_MAX_BYTES))
                setattr(req, _CHECKPOINT, checkpoint)
            return
        self._send_heartbeat(progress, checkpoint)

    @functools.cached_property
    def _request_top(self) -> Callable[[], Any]:
        """This task's current request in this thread, or ``None``: ``self.request`` for
        the heartbeat's hot path, without its cost (see
        :func:`~jobbers_celery.worker.heartbeat.request_getter`)."""
        return request_getter(self.request_stack)

    def _send_heartbeat(self, progress: Any, checkpoint: Any) -> None:
        """``heartbeat()`` past the throttle: the first call of an attempt, the first one
        a gap after the last one sent, any call outside a worker or while it shuts down."""
        if not self._tracked():
            hb.check(progress, checkpoint)  # every call checks: as in a worker, at the call
            return
        req = self.request
        beat = getattr(req, _HB, None)
        if beat is None:
            beat = hb.new_beat(self.jobbers_options)
            setattr(req, _HB, beat)
            if self._request_top() is not req:  # never seen: then the public, slower way
                stack = self.request_stack
                self._request_top = lambda: stack.top
        self._parts().heartbeats.send(req, beat, self.name, self.attempt, self.jobbers_options,
                                      progress, checkpoint)
