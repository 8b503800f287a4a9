"""JobbersTask: the Celery task base class. It drives an attempt and decides its outcome.

The task decides (which outcome, which delay, what to do in a store outage); the recorder
(:mod:`jobbers_celery.lifecycle.recorder`) records the decided outcome with its metrics and
dead letter, and the publisher republishes, so this class never writes a store step itself.
It decides with collaborators, objects handed what they use and built once per app
(:class:`~jobbers_celery.worker.parts.Parts`): the start (:mod:`~jobbers_celery.worker.start`), the heartbeat
(:mod:`~jobbers_celery.worker.heartbeat`), the outage policy and give-backs
(:mod:`~jobbers_celery.worker.outage`), and the delays that wait in the store
(:mod:`~jobbers_celery.worker.delays`).

The lifecycle runs inside ``__call__``, which Celery's tracer calls with the request already
pushed: one round trip to start (the attempt number it returns fences everything after),
one to complete. ``retry()`` is replaced so that delays wait in Redis, not in ETA messages.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar, NoReturn

from celery import Task
from celery.exceptions import Ignore, MaxRetriesExceededError, Reject, Retry, SoftTimeLimitExceeded
from celery.utils.saferepr import saferepr

from jobbers_celery.core import softlimit
from jobbers_celery.core.backoff import BackoffStrategy
from jobbers_celery.core.errors import AttemptSuperseded, TaskCancelled, TaskTimeout
from jobbers_celery.core.options import (
    OPTION_NAMES,
    DeadLetterPolicy,
    ShutdownPolicy,
    TaskOptions,
    validate_options,
)
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import liveness, payload, results
from jobbers_celery.lifecycle.publisher import publishing_unrecorded
from jobbers_celery.lifecycle.recorder import Run, error_fields
from jobbers_celery.store import UNREACHABLE, StepResult
from jobbers_celery.telemetry import metrics, tracing
from jobbers_celery.worker import heartbeat as hb
from jobbers_celery.worker import shutdown, taskrepr
from jobbers_celery.worker.delays import retry_delay, seconds_until
from jobbers_celery.worker.heartbeat import (
    CHECKPOINT_MAX_BYTES,
    HEARTBEAT_MIN_GAP_S,
    IMMUTABLE,
    PROGRESS_MAX_BYTES,
    request_getter,
    snapshot,
)
from jobbers_celery.worker.outage import HEADER_GIVEN_BACK, STORE_OUTAGE, Delivery, Ending
from jobbers_celery.worker.parts import Parts
from jobbers_celery.worker.shutdown import WorkerShuttingDown

__all__ = ["CHECKPOINT_MAX_BYTES", "HEADER_GIVEN_BACK", "HEARTBEAT_MIN_GAP_S",
           "PROGRESS_MAX_BYTES", "JobbersTask", "Revoked"]

#: The request reader ``heartbeat()`` uses (its tests reach it here).
_request_getter = request_getter

log = escaped_logger("jobbers.task")
S = TaskState

#: Request attributes jobbers sets on a running task's context.
_ATTEMPT = "jobbers_attempt"
_CHECKPOINT = hb.CHECKPOINT
_DONE = hb.DONE
_HB = hb.BEAT  # the attempt's heartbeat state, a heartbeat.Beat
_RUN = "jobbers_run"  # the running attempt, a recorder.Run
_ENDING = "jobbers_ending"  # its outage policy, an outage.Ending

#: Record fields a completed task no longer needs (the payload, the running attempt's
#: bookkeeping): dropping them keeps the finished record small.
_DROP_ON_COMPLETION = ("msg", "wid", "hb_iv", "srec")
#: Characters of args/kwargs an error message quotes (Celery's argsrepr limit).
_REPR_MAX = 1024


class Revoked(Ignore):
    """Raised by a task (an ``Ignore``: the tracer stores nothing) whose delivery ended
    ``cancelled`` in jobbers' record: cancelled at a heartbeat or by the step that ended it,
    interrupted under a pending cancellation, or received already cancelled. The worker's
    main process (:class:`~jobbers_celery.worker.request.JobbersRequest`) then tells Celery as for
    its own revoke: REVOKED in the result backend, a ``task-revoked`` event, the
    ``task_revoked`` signal; so that Flower and ``AsyncResult`` agree with the record."""

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


def _ends_cancelled(res: StepResult) -> bool:
    """The step ``res`` left the record ``cancelled`` (it applied so, or found it so)."""
    return (res.state is S.CANCELLED) if res.applied else res.previous == S.CANCELLED


class JobbersTask(Task):  # type: ignore[type-arg]
    """Base class for tracked tasks: ``@app.task(base=JobbersTask, ...)``."""

    Request = "jobbers_celery.worker.request:JobbersRequest"

    version: int = 1
    max_retries: int | None = 3
    retry_delay: float | timedelta | None = None
    backoff_strategy: BackoffStrategy | str = BackoffStrategy.EXPONENTIAL
    max_retry_delay: float | timedelta = 3600.0
    expected_exceptions: tuple[type[BaseException], ...] = ()
    timeout: float | timedelta | None = None
    dead_letter_policy: DeadLetterPolicy | str = DeadLetterPolicy.NONE
    max_heartbeat_interval: float | timedelta | None = None
    on_shutdown: ShutdownPolicy | str = ShutdownPolicy.STOP
    max_concurrent: int | None = None
    max_stall_recoveries: int = 0

    jobbers_options: ClassVar[TaskOptions] = TaskOptions()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.jobbers_options = validate_options({n: getattr(cls, n) for n in OPTION_NAMES})
        if cls.jobbers_options.timeout and getattr(cls, "soft_time_limit", None) is None:
            # prefork enforces it by raising SoftTimeLimitExceeded in the task
            cls.soft_time_limit = cls.jobbers_options.timeout  # type: ignore[assignment]

    # ------------------------------------------------------------------ inside a task
    @property
    def attempt(self) -> int:
        """1 for the first start of this task id, 2 for the next, and so on."""
        return int(getattr(self.request, _ATTEMPT, 0) or 0)

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
        the heartbeat's hot path, without its cost (see :func:`_request_getter`)."""
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

    def _pending_checkpoint(self) -> dict[str, str]:
        """What throttled heartbeats left unsent, encoded, to save with the outcome."""
        return hb.pending(self.request, self.name, self.attempt)

    def _parts(self) -> Parts:
        """What this task uses of its app's jobbers (``install(app)``), built once."""
        jobbers = Jobbers.of(self.app)
        parts: Parts | None = self.__dict__.get("_jobbers_parts")
        if parts is None or parts.jobbers is not jobbers:
            parts = self.__dict__["_jobbers_parts"] = Parts(jobbers)
        return parts

    def _tracked(self) -> bool:
        req = self.request
        return not (req.called_directly or req.is_eager) and bool(req.id)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)
        if not self._tracked():
            return self.run(*args, **kwargs)
        # The soft time limit may interrupt the task body only, never a lifecycle step.
        with softlimit.shielded():
            if shutdown.draining() and self.jobbers_options.on_shutdown is not \
                    ShutdownPolicy.CONTINUE:
                self._hand_back()
            self._start()
            try:
                with softlimit.allowed():
                    result = self.run(*args, **kwargs)
            except (Ignore, Retry):
                raise
            except Reject as exc:
                self._on_reject(exc)
                raise
            except AttemptSuperseded as exc:
                log.warning("%s", exc)
                raise Ignore() from None
            except TaskCancelled:
                if self._cancelled():
                    raise Revoked("cancellation honoured") from None
                raise Ignore() from None
            except (SystemExit, WorkerShuttingDown) as exc:
                if getattr(self.request, _DONE, False):
                    raise
                self._interrupted(exc)  # the worker is shutting down, or interrupting it
            except BaseException as exc:
                if getattr(self.request, _DONE, False):
                    raise
                self._redact(exc)
                if isinstance(exc, SoftTimeLimitExceeded) and self.jobbers_options.timeout:
                    exc = TaskTimeout(
                        f"ran longer than timeout={self.jobbers_options.timeout:g}s")
                expected = (*self.jobbers_options.expected_exceptions, TaskTimeout)
                if isinstance(exc, expected) and isinstance(exc, Exception):
                    raise self.retry(exc=exc) from exc
                if self._fail(exc, reason="unexpected exception"):
                    raise Revoked("cancellation requested") from exc
                raise
            self._complete(result)
            return result

    # ------------------------------------------------------------------ steps
    def _worker(self) -> str | None:
        return self.request.hostname or None

    def _run(self) -> Run:
        """The running attempt (set by :meth:`_start`)."""
        run: Run = getattr(self.request, _RUN)
        return run

    def _delivery(self) -> Delivery:
        req = self.request
        return Delivery(self.name, _id(req), int(req.retries or 0), self._worker(), req,
                        functools.partial(self.signature_from_request, req))

    def _start(self) -> None:
        parts = self._parts()
        req = self.request
        delivery = self._delivery()
        try:
            res = parts.starter.start(delivery, self.jobbers_options)
        except UNREACHABLE:
            parts.handover.give_back(delivery)
        STORE_OUTAGE.over()
        if _ends_cancelled(res):
            log.info("not running %s[%s]: it was cancelled", self.name, req.id)
            raise Revoked("cancelled before it ran")
        if not res.applied:
            log.warning("not running %s[%s]: it is %s (duplicate or stale delivery)",
                        self.name, req.id, res.previous)
            raise Ignore()
        if res.state is S.SCHEDULED:
            log.info("deferring %s[%s]: max_concurrent=%s reached", self.name, req.id,
                     self.jobbers_options.max_concurrent)
            raise Ignore()
        setattr(req, _ATTEMPT, res.attempt)
        ckpt = res.values.get("ckpt")
        setattr(req, _CHECKPOINT, payload.loads(ckpt) if ckpt else None)
        setattr(req, _RUN, parts.recorder.running(
            res, _id(req), self.name, self._worker(), liveness.worker_id(),
            published_ms=metrics.ms_value(
                payload.request_header(req, payload.HEADER_PUBLISHED_AT)),
            enqueued_ms=metrics.ms_value(
                payload.request_header(req, payload.HEADER_ENQUEUED_AT))))

    def _ending(self) -> Ending:
        """The outage policy of the steps that end this attempt, run around the recorder's
        call (the recorder only calls down, to the store): held through a store outage, and
        the start recorded again if the store lost it."""
        req = self.request
        ending: Ending | None = getattr(req, _ENDING, None)
        if ending is None:
            starter, delivery, opts = self._parts().starter, self._delivery(), self.jobbers_options
            ending = Ending(self.name, delivery.task_id, self.attempt,
                            lambda: starter.step(delivery, opts))
            setattr(req, _ENDING, ending)
        return ending

    def _complete(self, retval: Any) -> None:
        """Record ``completed``; with Celery's result write in the same script when it can.

        A completion refused because another attempt or outcome owns the record stores no
        result either (on both paths): the result must not contradict the record. Either
        way the tracer is told not to store it again.
        """
        req = self.request
        setattr(req, _DONE, True)
        parts = self._parts()
        write = parts.fold_result(self, retval)
        run, recorder, fields = self._run(), parts.recorder, self._pending_checkpoint()
        res = self._ending()(lambda: recorder.complete(run, fields=fields,
                                                       drop=_DROP_ON_COMPLETION, write=write))
        if not res.applied:
            log.warning("late completion of %s[%s] attempt %s rejected: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
        if write is not None and res.applied and not res.result_written:
            results.not_folded(self)  # the result db could not be selected: Celery writes it
        elif (write is not None and res.applied) or (not res.applied
                                                    and res.previous != "missing"):
            req.ignore_result = True  # read by the tracer's mark_as_done: skip its store

    def _cancelled(self) -> bool:
        """Record ``cancelled`` (the task honoured its cancellation); returns whether the
        record is now cancelled."""
        req = self.request
        setattr(req, _DONE, True)
        run, recorder = self._run(), self._parts().recorder
        res = self._ending()(lambda: recorder.cancel(run, reason="cancellation honoured"))
        if not res.applied:
            log.warning("late cancelled of %s[%s] attempt %s rejected: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
        return _ends_cancelled(res)

    def _fail(self, exc: BaseException, reason: str) -> bool:
        """Record ``failed`` (``cancelled`` if cancellation was pending); returns whether it
        ended cancelled."""
        req = self.request
        setattr(req, _DONE, True)
        run, recorder, fields = self._run(), self._parts().recorder, self._pending_checkpoint()
        dead_letter = self.jobbers_options.dead_letter_policy is DeadLetterPolicy.SAVE
        res = self._ending()(lambda: recorder.fail(run, exc, reason=reason, fields=fields,
                                                   dead_letter=dead_letter))
        if not res.applied:
            log.warning("failure of %s[%s] attempt %s not recorded: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
        return res.applied and res.state is S.CANCELLED

    def _hand_back(self) -> NoReturn:
        """A ``stop``/``resubmit`` task delivered to a worker that is shutting down (threads,
        solo: the consumer reads on for a moment) does not start there: its message is
        published again, unchanged, for another worker, and this delivery is dropped."""
        req = self.request
        self._parts().publisher.republish_signature(self.signature_from_request(req),
                                                    leased=None)
        log.info("not starting %s[%s]: this worker is shutting down; published it again",
                 self.name, req.id)
        raise Ignore()

    def _interrupted(self, exc: BaseException) -> NoReturn:
        """Apply ``on_shutdown`` to an attempt the worker interrupts (see :mod:`shutdown`).

        ``SystemExit`` is how a prefork child is interrupted: a warm shutdown (``stop`` and
        ``resubmit`` tasks), a cold one, SIGTERM to the whole process group, or
        ``cancel(terminate=True)`` (then the pending cancellation wins). A ``continue`` task
        interrupted anyway is resubmitted: nothing is lost.
        """
        req = self.request
        setattr(req, _DONE, True)
        shutdown.rearm_child_signals()  # this child lives on: the next SIGTERM must work too
        policy = self.jobbers_options.on_shutdown
        parts = self._parts()
        pending = self._pending_checkpoint()
        why = ("the worker shut down" if isinstance(exc, WorkerShuttingDown)
               else "interrupted by its worker (shutdown)")
        cancelled = "cancellation honoured: interrupted by its worker"
        # like any step that ends the attempt, held through a store outage (see _ending)
        run, recorder, ending = self._run(), parts.recorder, self._ending()
        if policy is ShutdownPolicy.STOP:
            dead_letter = self.jobbers_options.dead_letter_policy is DeadLetterPolicy.SAVE
            res = ending(lambda: recorder.stop(
                run, reason=f"{why} (on_shutdown=stop)", fields=pending,
                cancel_reason=cancelled, dead_letter=dead_letter))
        else:
            res = ending(lambda: recorder.requeue(
                run, reason=f"{why} (on_shutdown={policy.value}): resubmitted",
                fields=pending, lease=True, cancel_reason=cancelled))
            if res.applied and res.state is S.UNSUBMITTED:
                # same id, same retry count: records unsubmitted -> submitted on publish
                parts.publisher.republish_signature(self.signature_from_request(req),
                                                    leased=req.id)
        if _ends_cancelled(res):
            # a revoke with terminate (its cancellation was recorded before the signal),
            # or cancel(terminate=True): cancelled whatever on_shutdown says, no dead letter
            raise Revoked("cancellation honoured: interrupted by its worker")
        if not res.applied:
            log.info("%s[%s] interrupted; its record had moved on (%s)", self.name, req.id,
                     res.previous)
        raise Ignore()

    def _on_reject(self, exc: Reject) -> None:
        if getattr(exc, "requeue", False):
            # The broker hands the message back; its next start records a new submission.
            setattr(self.request, _DONE, True)
            self._parts().recorder.requeue(self._run(), reason="rejected with requeue")
        else:
            why = getattr(exc, "reason", None)
            cause = why if isinstance(why, BaseException) else RuntimeError(f"rejected: {why!r}")
            self._fail(cause, reason="rejected")

    def _redact(self, exc: BaseException) -> None:
        """Take the secrets out of the message of ``exc`` before Celery logs it and sends it
        in task events, and jobbers records it (see :mod:`jobbers_celery.worker.taskrepr`)."""
        req = self.request
        try:
            redact = self._parts().redactor
        except Exception:  # noqa: BLE001 - not installed: nothing to redact by
            return
        taskrepr.redact_exception(exc, self, req.args, req.kwargs, redact)

    # ------------------------------------------------------------------ publish
    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> Any:
        """Celery's ``apply_async``, except that a ``countdown`` or ``eta`` in the future
        waits in the store, not in an ETA message at the broker (which a Redis broker
        delivers again once its visibility timeout passes): the task is recorded
        ``scheduled`` (``run_at`` set, listed by ``scheduled()``) and a worker's scheduler
        publishes it when due, as it does a delayed retry. ``expires`` still counts from
        this call. If the store cannot take it, it goes out as Celery's ETA message."""
        delay = seconds_until(options.get("countdown"), options.get("eta"))
        # a delivery put back (publishing unrecorded) goes out as Celery's ETA message
        if delay > 0 and not publishing_unrecorded() and Jobbers.find(self.app) is not None \
                and not self.app.conf.task_always_eager:
            later = self._parts().delays.publish_later(
                self, self.jobbers_options, args, kwargs, task_id, link, link_error, shadow,
                options, delay)
            if later is not None:
                return later
        if self.app.conf.task_send_sent_event and "argsrepr" not in options \
                and "kwargsrepr" not in options:
            self._redacted_reprs(args, kwargs, options)
        return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow,
                                   **options)

    def _redacted_reprs(self, args: Any, kwargs: Any, options: dict[str, Any]) -> None:
        """The ``task-sent`` event is built before ``before_task_publish`` (where every
        publish gets its redacted reprs): give it redacted ones too."""
        try:
            reprs = taskrepr.sent_reprs(self.app, self, args, kwargs,
                                        self._parts().redactor)
        except Exception:  # not installed, odd arguments: Celery's own reprs
            log.debug("no redacted reprs for the task-sent event of %s", self.name,
                      exc_info=True)
            return
        if reprs is not None:
            options["argsrepr"], options["kwargsrepr"] = reprs

    # ------------------------------------------------------------------ retries
    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Exception | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Retry with jobbers' backoff; a delay waits in Redis, never in an ETA message.

        ``countdown``/``eta`` override the task's backoff for this retry.
        """
        if not self._tracked():
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries,
                                 **options)
        with softlimit.shielded():  # record and publish the retry without interruption
            return self._retry(args, kwargs, exc, throw, eta, countdown, max_retries, options)

    def _retry(
        self, args: Any, kwargs: Any, exc: Exception | None, throw: bool,
        eta: datetime | None, countdown: float | None, max_retries: int | None,
        options: dict[str, Any],
    ) -> Retry:
        req = self.request
        limit = self.max_retries if max_retries is None else max_retries
        n = int(req.retries or 0) + 1
        if exc is not None:
            self._redact(exc)
        if limit is not None and n > limit:
            # the arguments as Celery shows them in messages and logs (argsrepr): bounded,
            # or a big payload would be copied into the record, the dead letter and the result
            error = exc or MaxRetriesExceededError(
                f"Can't retry {self.name}[{req.id}] args:{saferepr(req.args, _REPR_MAX)} "
                f"kwargs:{saferepr(req.kwargs, _REPR_MAX)}"
            )
            self._redact(error)
            if self._fail(error, reason="retries exhausted"):
                raise Revoked("cancellation requested") from error
            raise error
        delay = retry_delay(self.jobbers_options, n, eta, countdown)
        sig = self.signature_from_request(req, args, kwargs, retries=n, **options)
        headers = dict(sig.options.get("headers") or {})
        tracing.stamp(headers)  # this attempt's span, if any: the retry continues its trace
        if headers:
            sig.options["headers"] = headers
        fields = {**self._pending_checkpoint(),
                  **(error_fields(exc) if exc is not None else {}), "retries": str(n)}
        setattr(req, _DONE, True)
        parts = self._parts()
        reason = f"retry {n}" + (f" of {limit}" if limit is not None else "")
        version = self.jobbers_options.version
        when: datetime | None = None
        if delay > 0:  # waits in the store, not in an ETA message
            res, when = parts.delays.retry_later(self._run(), sig, fields, reason=reason,
                                                 delay=delay, version=version,
                                                 ending=self._ending())
        else:
            try:
                data = payload.from_signature_options(sig.args, sig.kwargs, dict(sig.options))
                fields["msg"] = parts.recorder.encode(data)
            except TypeError:
                pass  # not JSON: the record keeps the payload it had
            # the publish lease: should this process die before publishing, a scheduler
            # publishes the recorded payload once the lease expires
            run, recorder = self._run(), parts.recorder
            res = self._ending()(lambda: recorder.retry_now(run, reason=reason, fields=fields,
                                                            version=version))
            if res.applied and res.state is S.UNSUBMITTED:
                # records unsubmitted -> submitted on publish
                parts.publisher.republish_signature(sig, leased=req.id)
        if not res.applied:
            log.warning("retry of %s[%s] attempt %s not recorded: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
        elif res.state is S.CANCELLED:
            log.info("%s[%s] was cancelled: not retried", self.name, req.id)
            raise Revoked("cancellation requested")
        retry = Retry(exc=exc, when=when)
        if throw:
            raise retry
        return retry


def _id(req: Any) -> str:
    """The id of a tracked task's request (always set: see ``_tracked``)."""
    task_id: str = req.id
    return task_id
