"""JobbersTask: the Celery task base class. Outcome decisions (retry, fail, drop) live here.

The task decides (which outcome, which delay, what to do in a store outage); the recorder
(:mod:`jobbers_celery.lifecycle.recorder`) records the decided outcome with its metrics and dead letter,
and the publisher republishes, so this class never writes a store step itself.

The lifecycle runs inside ``__call__``, which Celery's tracer calls with the request already
pushed: one round trip to start (the attempt number it returns fences everything after),
one to complete. ``retry()`` is replaced so that delays wait in Redis, not in ETA messages.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, NoReturn

from celery import Task
from celery.exceptions import Ignore, MaxRetriesExceededError, Reject, Retry, SoftTimeLimitExceeded
from celery.utils import uuid
from celery.utils.saferepr import saferepr
from kombu.exceptions import OperationalError

from jobbers_celery.core import softlimit
from jobbers_celery.core.backoff import BackoffStrategy, compute_delay
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
from jobbers_celery.lifecycle.recorder import Run, error_fields, publishing_unrecorded
from jobbers_celery.store import UNREACHABLE, Giver, StepResult, is_outage
from jobbers_celery.telemetry import metrics, tracing
from jobbers_celery.worker import shutdown, taskrepr
from jobbers_celery.worker.beat import (
    CHECKPOINT_MAX_BYTES,
    IMMUTABLE,
    PROGRESS_MAX_BYTES,
    Beat,
    Encoded,
    encode,
    encoded,
    request_getter,
    snapshot,
)
from jobbers_celery.worker.shutdown import WorkerShuttingDown

__all__ = ["CHECKPOINT_MAX_BYTES", "PROGRESS_MAX_BYTES", "JobbersTask", "Revoked"]

#: The request reader ``heartbeat()`` uses (its tests reach it here).
_request_getter = request_getter

log = escaped_logger("jobbers.task")
S = TaskState

#: Request attributes jobbers sets on a running task's context.
_ATTEMPT = "jobbers_attempt"
_CHECKPOINT = "jobbers_checkpoint"
_DONE = "jobbers_outcome_recorded"
_HB = "jobbers_heartbeat"  # the attempt's heartbeat state, a beat.Beat
_RUN = "jobbers_run"  # the running attempt, a recorder.Run
#: In the reason of a stall the worker's liveness thread decided (stall.lua, kind "gone").
ORPHAN_STALL = "its end was not recorded"
#: The header of a message a worker gave back during a store outage:
#: "<incarnation>[,<incarnation>...]/<retries>", every worker incarnation that gave this
#: delivery back (at most ``GIVERS_KEPT``, the first ones), any of which may hold its start.
HEADER_GIVEN_BACK = "jobbers_given_back"
GIVERS_KEPT = 16
#: The header is a claim, never proof: a start it names is taken back only if the store
#: says so (the giver's incarnation is gone, or its own liveness refresh said it does not
#: run that attempt). While the giver lives and may still say so, the delivery is put back
#: (published again this many refresh periods later, at least a second) and asks again.
TAKE_BACK_ASK_AGAIN_PERIODS = 1.0
#: Refresh periods a giver's liveness refresh is given, after it could first have found the
#: attempt not running there, before its silence means it runs it.
TAKE_BACK_MARGIN_PERIODS = 3

#: Record fields a completed task no longer needs (the payload, the running attempt's
#: bookkeeping): dropping them keeps the finished record small.
_DROP_ON_COMPLETION = ("msg", "wid", "hb_iv", "srec")

#: A heartbeat is sent at most this often per task (more often only if
#: ``max_heartbeat_interval`` is short: then four times per interval).
HEARTBEAT_MIN_GAP_S = 1.0
#: A task over its ``max_concurrent`` cap is deferred by a random delay in this range.
DEFER_RANGE_S = (0.5, 1.5)
#: Characters of args/kwargs an error message quotes (Celery's argsrepr limit).
_REPR_MAX = 1024
#: Pauses between tries of a finished task's outcome while the store is unreachable
#: (doubling from the first to the last; each try also waits out the outage itself).
OUTAGE_RESEND_FIRST_PAUSE_S, OUTAGE_RESEND_MAX_PAUSE_S = 0.5, 5.0


class _Outage:
    """Whether this worker process is in a state-store outage: its beginning and its end
    are logged once each, not once per task."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: float | None = None

    def began(self) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("the jobbers state store cannot be reached: until it answers, this "
                        "worker process gives the tasks it receives back to the broker (not "
                        "run), and holds the outcomes of the tasks it ran until they are "
                        "recorded")

    def over(self) -> None:
        if self.since is not None:
            log.warning("the jobbers state store answers again (unreachable for %.1f s): "
                        "tasks start and their outcomes are recorded",
                        time.monotonic() - self.since)
            self.since = None


_outage = _Outage()


class _HeldMessage:
    """Whether this worker process holds a message it could neither start (the store is
    away) nor give back (the broker is away too: one Redis for both, or both down). Said
    once when the first give-back is refused and once when the broker takes it, not once
    per try."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: float | None = None

    def began(self, name: str, task_id: str | None, exc: BaseException) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("the broker cannot take the message of %s[%s] back either (%s): this "
                        "worker process holds it (not run) and publishes it again, with a "
                        "pause, until the broker takes it", name, task_id, exc)

    def over(self) -> None:
        if self.since is not None:
            log.warning("the broker took back the message this worker process held for "
                        "%.1f s", time.monotonic() - self.since)
            self.since = None


_held = _HeldMessage()


def _givers(header: Any, retries: int) -> list[str]:
    """The worker incarnations a ``jobbers_given_back`` header names for the delivery with
    ``retries`` (none for another retry: a retry's message copies the header)."""
    names, _, of = str(header or "").rpartition("/")
    return [n for n in names.split(",") if n] if of == str(retries) else []


def _givers_header(header: Any, retries: int) -> str:
    """The ``jobbers_given_back`` header of a message this worker gives back: the givers
    before it (a message can bounce between workers while the store is away; the start that
    applied with its reply lost may be any of theirs) and this incarnation."""
    givers = _givers(header, retries)
    me = liveness.worker_id()
    if me not in givers and len(givers) < GIVERS_KEPT:
        givers.append(me)
    return f"{','.join(givers)}/{retries}"


def _giver_rule(jobbers: Jobbers) -> Giver:
    """How a take-back judges the giver a header names: gone after ``worker_lost_after``
    unseen; alive, it has had its chance to say it does not run the attempt (its liveness
    refresh reports the attempts older than ``worker_lost_after`` it does not run) once
    seen that long after the attempt started, plus a margin of a few refreshes."""
    lost_s = jobbers.config.worker_lost_after
    lost_ms = int(lost_s * 1000)
    margin_ms = int(TAKE_BACK_MARGIN_PERIODS * liveness.refresh_period(lost_s) * 1000)
    return Giver(gone_ms=lost_ms, settle_ms=lost_ms + margin_ms)


def _broker_away(exc: BaseException) -> bool:
    """``exc``, raised by a publish, means the broker cannot be reached or take the message
    for now: kombu's ``OperationalError`` (a connection error, once the publish's own retries
    are spent), or a Redis broker refusing writes (``OOM`` and the like)."""
    return isinstance(exc, OperationalError) or is_outage(exc)


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


def _jobbers(task: Task[Any, Any]) -> Jobbers:
    """The service of the task's app (``install(app)``): typed, so that mypy checks what
    the task class asks of the store, the recorder and the publisher."""
    return Jobbers.of(task.app)


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
            # every call checks here: task code tested outside a worker meets the errors
            if progress is not None:
                encode("progress", progress, PROGRESS_MAX_BYTES)
            if checkpoint is not None:
                encode("checkpoint", checkpoint, CHECKPOINT_MAX_BYTES)
            return
        req = self.request
        opts = self.jobbers_options
        beat = getattr(req, _HB, None)
        if beat is None:
            gap = HEARTBEAT_MIN_GAP_S
            if opts.max_heartbeat_interval:
                gap = min(gap, opts.max_heartbeat_interval / 4)
            beat = Beat(gap, stops=opts.on_shutdown is not ShutdownPolicy.CONTINUE)
            setattr(req, _HB, beat)
            if self._request_top() is not req:  # never seen: then the public, slower way
                stack = self.request_stack
                self._request_top = lambda: stack.top
        if beat.stops and shutdown.draining():
            raise WorkerShuttingDown(f"the worker is shutting down (on_shutdown={opts.on_shutdown})")
        if progress is not None:
            beat.progress = snapshot("progress", progress, PROGRESS_MAX_BYTES)
        if checkpoint is not None:
            beat.ckpt = snapshot("checkpoint", checkpoint, CHECKPOINT_MAX_BYTES)
        now = time.monotonic()
        if now < beat.due:
            if checkpoint is not None:
                setattr(req, _CHECKPOINT, checkpoint)
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
            setattr(req, _CHECKPOINT, checkpoint)
        jobbers = _jobbers(self)
        with softlimit.shielded(drop=False):
            result = jobbers.store.heartbeat(
                _id(req), self.attempt, progress=encoded_progress, checkpoint=encoded_ckpt,
                name=self.name,
                lease_cap_ms=self._lease_ms(jobbers) if opts.max_concurrent else None,
            )
        beat.due = now + beat.gap
        if not result.delivered:  # Redis unreachable: keep it for the next one
            return
        beat.progress = beat.ckpt = None
        if not result.accepted:
            setattr(req, _DONE, True)  # nothing this attempt reports would be accepted
            raise AttemptSuperseded(
                f"{self.name}[{req.id}] attempt {self.attempt} is no longer the running "
                f"attempt (the task is {result.state}, attempt {result.attempt})")
        if result.cancel_requested:
            raise TaskCancelled(f"{self.name}[{req.id}] was cancelled")

    def _pending_checkpoint(self) -> dict[str, str]:
        """What throttled heartbeats left unsent (progress, checkpoint), encoded, to save
        with the outcome. A value that does not encode can no longer reach the task: it is
        logged and left out (the record keeps the last one sent)."""
        req = self.request
        beat = getattr(req, _HB, None)
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
                          "saved with its outcome: %s", self.name, req.id, self.attempt, what,
                          exc)
                continue
            fields[attr] = text  # the record's fields: progress, ckpt
            setattr(beat, attr, Encoded(text))  # the step may be sent again: encode once
        return fields

    def _lease_ms(self, jobbers: Jobbers) -> int:
        return int(jobbers.config.worker_lost_after * 1000)

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

    def _start(self) -> None:
        jobbers = _jobbers(self)
        req = self.request
        try:
            res = self._start_recorded(jobbers)
        except UNREACHABLE:
            self._give_back(jobbers)
        _outage.over()
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
        setattr(req, _RUN, jobbers.recorder.running(
            res, _id(req), self.name, self._worker(), liveness.worker_id(),
            published_ms=metrics.ms_value(
                payload.request_header(req, payload.HEADER_PUBLISHED_AT)),
            enqueued_ms=metrics.ms_value(
                payload.request_header(req, payload.HEADER_ENQUEUED_AT))))

    def _start_recorded(self, jobbers: Jobbers) -> StepResult:
        """Record ``started`` (and the submission first, if the message has no record).
        Raises ``UNREACHABLE`` if the store cannot be reached within the wait: then the
        start is not recorded (or not known to be), and the task must not run here."""
        req = self.request
        res = self._start_once(jobbers)
        if not res.applied and res.previous == "missing" and self._record_was_removed(jobbers):
            log.warning("not running %s[%s]: its record was removed (purged, or older than "
                        "jobbers_retention) after it was published", self.name, req.id)
            raise Ignore()
        if not res.applied and res.previous in ("missing", S.UNSUBMITTED):
            # Published without a record (Redis was unreachable at publish, or by a client
            # without jobbers): record the submission now rather than lose track of it.
            self._record_late_submit(jobbers)
            res = self._start_once(jobbers)
        if not res.applied and res.previous in (S.STARTED, S.STALLED) \
                and payload.request_header(req, HEADER_GIVEN_BACK):
            res = self._take_back(jobbers, res)
        return res

    def _start_once(self, jobbers: Jobbers) -> StepResult:
        try:
            return self._start_step(jobbers)
        except UNREACHABLE:
            return self._start_reply_lost(jobbers)

    def _give_back(self, jobbers: Jobbers) -> NoReturn:
        """The store did not answer within ``jobbers_worker_lost_after``: the start is not
        recorded (or not known to be), so this delivery does not run, and its message is not
        consumed and dropped either: it is published again, unchanged (same id, arguments,
        headers and retry count), without asking the store, for this worker or another to
        run once the store answers, and this delivery ends (acknowledged: early ack already
        did, ``acks_late`` does now, after the publish). The new message names this worker
        incarnation (``jobbers_given_back``, after the givers of earlier deliveries of the
        same message): should the start have been recorded after all (its reply was lost),
        the delivery of the new message takes the task back from it.
        The outage is logged once per worker process, not per task.

        If the broker refuses the publish too (one Redis for both, or both away), the
        message is held here, never dropped, and published again, with a pause growing
        from ``OUTAGE_RESEND_FIRST_PAUSE_S`` to ``OUTAGE_RESEND_MAX_PAUSE_S``, until the
        broker takes it. The task is not started here meanwhile, even if the store answers
        first: a refused publish may have reached the broker (its reply lost), and the copy,
        naming this incarnation, would take back a start made here and run the task twice."""
        req = self.request
        _outage.began()
        sig = self.signature_from_request(req)
        headers = dict(sig.options.get("headers") or {})
        headers[HEADER_GIVEN_BACK] = _givers_header(
            payload.request_header(req, HEADER_GIVEN_BACK), int(req.retries or 0))
        sig.options["headers"] = headers
        pause = OUTAGE_RESEND_FIRST_PAUSE_S
        while True:
            try:
                jobbers.publisher.give_back(sig)
            except Exception as exc:
                if not _broker_away(exc):
                    raise
                _held.began(self.name, req.id, exc)
                time.sleep(pause)
                pause = min(2 * pause, OUTAGE_RESEND_MAX_PAUSE_S)
                continue
            _held.over()
            log.debug("gave %s[%s] back to the broker (published again): the state store "
                      "cannot be reached", self.name, req.id)
            raise Ignore()

    def _take_back(self, jobbers: Jobbers, res: StepResult) -> StepResult:
        """The start of a message given back during an outage (see :meth:`_give_back`) was
        refused: the task is ``started``, or ``stalled``. The header only names who may hold
        that start; the store decides, in the step itself. If a worker incarnation that gave
        it back holds that start (its ``started`` step applied, but its reply was lost, and
        the task never ran) and that incarnation is gone, or its liveness refresh said it
        does not run that attempt, the attempt is ended (``started -> unsubmitted``, fenced
        by its attempt and worker) and this delivery records the submission and starts the
        task; while the giver is alive and has not said so yet, the delivery asks again
        later (:meth:`_ask_again_later`). The same if that worker's liveness thread stalled
        the attempt meanwhile as an end that was not recorded (``stalled -> submitted``,
        fenced the same way and by the store's mark of that verdict). A giver alive that
        still holds the start after its liveness had its chance runs it (a copied or crafted
        header): the refusal stands, as it does otherwise. Returns the start's result."""
        req = self.request
        givers = _givers(payload.request_header(req, HEADER_GIVEN_BACK), int(req.retries or 0))
        if res.previous == S.STALLED:
            return self._take_back_stall(jobbers, res, givers)
        for giver in givers:
            found = jobbers.store.started_by(_id(req), giver)
            if found is not None and found.attempt == res.attempt:
                break
        else:
            return res
        back = jobbers.recorder.take_back(_id(req), self.name, attempt=found.attempt,
                                          giver=giver, worker=self._worker(),
                                          judge=_giver_rule(jobbers))
        if back.why == "giver_alive":
            self._ask_again_later(jobbers, giver)
        if not (back.applied and back.state is S.UNSUBMITTED):
            if back.why == "giver_runs_it":
                log.warning("not running %s[%s]: its jobbers_given_back header names worker "
                            "incarnation %s, which is alive and runs it (a copied or crafted "
                            "header is not taken for a give-back)", self.name, req.id, giver)
            return res
        log.info("%s[%s]: its start was recorded during a state store outage but it never "
                 "ran there; starting it now", self.name, req.id)
        self._record_late_submit(jobbers)
        jobbers.publisher.confirm([_id(req)])
        return self._start_once(jobbers)

    def _ask_again_later(self, jobbers: Jobbers, giver: str) -> NoReturn:
        """The giver of this given-back message holds the start and is alive: its liveness
        refresh may still say it does not run that attempt (then the next delivery takes it
        back), or the giver runs it (a copied or crafted header: the next delivery is
        refused for good). This delivery does not run: its message is published again,
        unchanged, as Celery's ETA message (not recorded), to ask again a little later."""
        req = self.request
        sig = self.signature_from_request(req)
        headers = dict(sig.options.get("headers") or {})
        headers[HEADER_GIVEN_BACK] = str(payload.request_header(req, HEADER_GIVEN_BACK) or "")
        sig.options["headers"] = headers
        sig.options["countdown"] = max(1.0, TAKE_BACK_ASK_AGAIN_PERIODS * liveness.refresh_period(
            jobbers.config.worker_lost_after))
        try:
            jobbers.publisher.give_back(sig)
        except Exception:
            log.exception("not running %s[%s]: worker incarnation %s, alive, holds its start; "
                          "its message could not be put back to ask again (the cleaner ends "
                          "that attempt if it does not run it)", self.name, req.id, giver)
            raise Ignore() from None
        log.info("not running %s[%s] yet: worker incarnation %s, alive, holds its start; "
                 "asking again in %.1f s", self.name, req.id, giver, sig.options["countdown"])
        raise Ignore()

    def _take_back_stall(self, jobbers: Jobbers, res: StepResult,
                         givers: list[str]) -> StepResult:
        """See :meth:`_take_back`: the attempt a giver held was stalled by its worker as an
        end not recorded (the giver's request was over, the task not running there)."""
        req = self.request
        task_id = _id(req)
        raw = jobbers.store.get_raw(task_id)
        giver = raw.get("wid") or ""
        if giver not in givers or raw.get("state") != S.STALLED.value \
                or int(raw.get("attempt") or 0) != res.attempt:
            return res
        history = jobbers.store.history(task_id)
        if not history or ORPHAN_STALL not in (history[-1].reason or ""):
            return res
        back = jobbers.recorder.take_back_stall(task_id, self.name, attempt=res.attempt,
                                                giver=giver, worker=self._worker())
        if not (back.applied and back.state is S.SUBMITTED):
            return res
        log.warning("%s[%s]: its start was recorded during a state store outage but it never "
                    "ran there, and it was stalled as an end not recorded meanwhile; starting "
                    "it now", self.name, req.id)
        return self._start_once(jobbers)

    def _start_reply_lost(self, jobbers: Jobbers) -> StepResult:
        """Redis went away after the ``started`` step was sent: whether it applied is
        unknown. Once Redis answers again (waiting up to ``jobbers_worker_lost_after``), the
        record tells: started by this worker incarnation (it applied), or not (send it again),
        so that the task neither fails on the outage nor starts twice."""
        deadline = time.monotonic() + jobbers.config.worker_lost_after
        while True:
            try:
                found = jobbers.store.started_by(_id(self.request), liveness.worker_id())
                return found if found is not None else self._start_step(jobbers)
            except UNREACHABLE:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _record_was_removed(self, jobbers: Jobbers) -> bool:
        """Was this message's submission recorded in the current dataset? Then a missing
        record was removed on purpose and the message must not run. Otherwise (published
        while Redis was unreachable, by a client without jobbers, or before the dataset was
        lost) the worker records it late and runs it."""
        req = self.request
        epoch = payload.request_header(req, payload.HEADER_EPOCH)
        return bool(epoch) and epoch == jobbers.store.epoch(str(req.id))

    def _start_step(self, jobbers: Jobbers) -> StepResult:
        opts = self.jobbers_options
        hb_ms = round(opts.max_heartbeat_interval * 1000) if opts.max_heartbeat_interval else None
        fields = {}
        if opts.max_stall_recoveries:
            fields["srec"] = str(opts.max_stall_recoveries)
        return jobbers.recorder.start(
            _id(self.request), self.name, worker=self._worker(), wid=liveness.worker_id(),
            heartbeat_ms=hb_ms, cap=opts.max_concurrent, lease_cap_ms=self._lease_ms(jobbers),
            defer_ms=round(random.uniform(*DEFER_RANGE_S) * 1000), fields=fields,
        )

    def _record_late_submit(self, jobbers: Jobbers) -> None:
        req = self.request
        sig = self.signature_from_request(req)
        data = payload.from_signature_options(req.args, req.kwargs, dict(sig.options))
        opts = self.jobbers_options
        jobbers.recorder.late_submit(
            _id(req), self.name, opts.version, payload.queue_of(data["options"]),
            opts.dead_letter_policy is DeadLetterPolicy.SAVE, jobbers.recorder.encode(data),
            int(req.retries or 0))

    def _terminal(self, step: Callable[[], StepResult]) -> StepResult:
        """Run the step that ends this attempt; if the store no longer knows the attempt
        started (the record is back at ``submitted`` with the attempt before: a failover or
        restart lost that write), record the start again and run the step once more, so the
        outcome is not lost with it."""
        try:
            res = step()
        except UNREACHABLE:
            res = self._resend_after_outage(step)
        if (not res.applied and res.previous == S.SUBMITTED
                and res.attempt == self.attempt - 1):
            log.warning("the start of %s[%s] attempt %s was lost by the store (failover or "
                        "restart); recording it again", self.name, self.request.id,
                        self.attempt)
            again = self._start_step(_jobbers(self))
            if again.applied and again.state is S.STARTED and again.attempt == self.attempt:
                res = step()
        return res

    def _resend_after_outage(self, step: Callable[[], StepResult]) -> StepResult:
        """The step that ends this attempt could not be written: the store is unreachable
        (each try waits up to ``jobbers_worker_lost_after``). The task's body has finished,
        so its outcome is held and sent again, with a backoff up to
        ``OUTAGE_RESEND_MAX_PAUSE_S`` between tries, until the store answers, however long
        the outage lasts: never recorded failed, never run again because of it. The step
        is fenced by the attempt, so if an earlier try applied (its reply lost), this one
        is refused (the task is already in the end state) and nothing is applied twice.
        Meanwhile this pool slot takes no other task."""
        _outage.began()
        pause = OUTAGE_RESEND_FIRST_PAUSE_S
        while True:
            try:
                res = step()
            except UNREACHABLE:
                time.sleep(pause)
                pause = min(2 * pause, OUTAGE_RESEND_MAX_PAUSE_S)
                continue
            _outage.over()
            return res

    def _complete(self, retval: Any) -> None:
        """Record ``completed``; with Celery's result write in the same script when it can.

        A completion refused because another attempt or outcome owns the record stores no
        result either (on both paths): the result must not contradict the record. Either
        way the tracer is told not to store it again.
        """
        req = self.request
        setattr(req, _DONE, True)
        jobbers = _jobbers(self)
        write = results.folded_result(self, jobbers.store, retval)
        res = jobbers.recorder.complete(self._run(), fields=self._pending_checkpoint(),
                                        drop=_DROP_ON_COMPLETION, write=write,
                                        guard=self._terminal)
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
        res = _jobbers(self).recorder.cancel(self._run(), reason="cancellation honoured",
                                             guard=self._terminal)
        if not res.applied:
            log.warning("late cancelled of %s[%s] attempt %s rejected: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
        return _ends_cancelled(res)

    def _fail(self, exc: BaseException, reason: str) -> bool:
        """Record ``failed`` (``cancelled`` if cancellation was pending); returns whether it
        ended cancelled."""
        req = self.request
        setattr(req, _DONE, True)
        res = _jobbers(self).recorder.fail(
            self._run(), exc, reason=reason, fields=self._pending_checkpoint(),
            dead_letter=self.jobbers_options.dead_letter_policy is DeadLetterPolicy.SAVE,
            guard=self._terminal)
        if not res.applied:
            log.warning("failure of %s[%s] attempt %s not recorded: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
        return res.applied and res.state is S.CANCELLED

    def _hand_back(self) -> NoReturn:
        """A ``stop``/``resubmit`` task delivered to a worker that is shutting down (threads,
        solo: the consumer reads on for a moment) does not start there: its message is
        published again, unchanged, for another worker, and this delivery is dropped."""
        req = self.request
        _jobbers(self).publisher.republish_signature(self.signature_from_request(req),
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
        jobbers = _jobbers(self)
        pending = self._pending_checkpoint()
        why = ("the worker shut down" if isinstance(exc, WorkerShuttingDown)
               else "interrupted by its worker (shutdown)")
        cancelled = "cancellation honoured: interrupted by its worker"
        # like any step that ends the attempt, held through a store outage (see _terminal)
        if policy is ShutdownPolicy.STOP:
            res = jobbers.recorder.stop(
                self._run(), reason=f"{why} (on_shutdown=stop)", fields=pending,
                cancel_reason=cancelled,
                dead_letter=self.jobbers_options.dead_letter_policy is DeadLetterPolicy.SAVE,
                guard=self._terminal)
        else:
            res = jobbers.recorder.requeue(
                self._run(), reason=f"{why} (on_shutdown={policy.value}): resubmitted",
                fields=pending, lease=True, cancel_reason=cancelled, guard=self._terminal)
            if res.applied and res.state is S.UNSUBMITTED:
                # same id, same retry count: records unsubmitted -> submitted on publish
                jobbers.publisher.republish_signature(self.signature_from_request(req),
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
            _jobbers(self).recorder.requeue(self._run(), reason="rejected with requeue")
        else:
            why = getattr(exc, "reason", None)
            cause = why if isinstance(why, BaseException) else RuntimeError(f"rejected: {why!r}")
            self._fail(cause, reason="rejected")

    def _redact(self, exc: BaseException) -> None:
        """Take the secrets out of the message of ``exc`` before Celery logs it and sends it
        in task events, and jobbers records it (see :mod:`jobbers_celery.worker.taskrepr`)."""
        req = self.request
        try:
            redact = taskrepr.redactor_of(_jobbers(self).config)
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
        delay = _seconds_until(options.get("countdown"), options.get("eta"))
        if delay > 0 and not publishing_unrecorded():  # a delivery put back: Celery's ETA
            jobbers = Jobbers.find(self.app)
            if jobbers is not None and not self.app.conf.task_always_eager:
                later = self._publish_later(jobbers, args, kwargs, task_id, link, link_error,
                                            shadow, options, delay)
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
                                        taskrepr.redactor_of(_jobbers(self).config))
        except Exception:  # not installed, odd arguments: Celery's own reprs
            log.debug("no redacted reprs for the task-sent event of %s", self.name,
                      exc_info=True)
            return
        if reprs is not None:
            options["argsrepr"], options["kwargsrepr"] = reprs

    def _publish_later(self, jobbers: Jobbers, args: Any, kwargs: Any, task_id: str | None,
                       link: Any, link_error: Any, shadow: str | None,
                       options: dict[str, Any], delay: float) -> Any:
        """Record the first publish ``scheduled`` after ``delay`` seconds; returns its
        ``AsyncResult``, or ``None`` when it must go out as an ETA message instead."""
        check = getattr(self, "__header__", None) if self.typing else None
        if check is not None:
            check(*(args or ()), **(kwargs or {}))  # the TypeError apply_async raises
        namer: Callable[..., str | None] = self.shadow_name  # a subclass may name it
        opts: dict[str, Any] = {**self._get_exec_options(),  # type: ignore[attr-defined]
                                **options, "link": link, "link_error": link_error,
                                "shadow": shadow or namer(args, kwargs, options)}
        for key in ("countdown", "eta", "producer", "connection", "publisher"):
            opts.pop(key, None)
        opts.setdefault("ignore_result", self.ignore_result)
        parent = self.app.current_worker_task
        if parent is not None and parent.request.id:  # as send_task links it to its parent
            opts.setdefault("parent_id", parent.request.id)
            opts.setdefault("root_id", parent.request.root_id or parent.request.id)
        headers = dict(opts.get("headers") or {})
        tracing.stamp(headers)  # the publishing client's trace: the scheduler continues it
        opts["headers"] = headers
        routed = self.app.amqp.router.route(dict(opts), self.name, args, kwargs,
                                            self)  # type: ignore[arg-type]  # as Celery does
        queue = str(getattr(routed.get("queue"), "name", None) or routed.get("routing_key")
                    or "")
        task_id = task_id or uuid()
        opt = self.jobbers_options
        why = "countdown" if options.get("countdown") else "eta"
        try:
            res = jobbers.recorder.publish_later(
                task_id, self.name, payload.deferred(args, kwargs, opts, queue, datetime.now(UTC)),
                version=opt.version, dead_letter=opt.dead_letter_policy is DeadLetterPolicy.SAVE,
                delay_ms=round(delay * 1000), reason=f"delayed first run ({why})")
        except TypeError:
            log.warning("%s[%s]: its publish options or arguments are not JSON: sent as an "
                        "ETA message, which waits at the broker", self.name, task_id)
            return None
        except UNREACHABLE:
            log.warning("%s[%s]: the state store cannot be reached: sent as an ETA message, "
                        "which waits at the broker", self.name, task_id)
            return None
        if not (res.applied and res.state is S.SCHEDULED):
            log.warning("%s[%s]: not recorded as a delayed first run (the task is %s): sent "
                        "as an ETA message", self.name, task_id, res.previous)
            return None
        return self.AsyncResult(task_id)

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
        delay = self._retry_delay(n, eta, countdown)
        sig = self.signature_from_request(req, args, kwargs, retries=n, **options)
        headers = dict(sig.options.get("headers") or {})
        tracing.stamp(headers)  # this attempt's span, if any: the retry continues its trace
        if headers:
            sig.options["headers"] = headers
        fields = {**self._pending_checkpoint(),
                  **(error_fields(exc) if exc is not None else {}), "retries": str(n)}
        setattr(req, _DONE, True)
        jobbers = _jobbers(self)
        reason = f"retry {n}" + (f" of {limit}" if limit is not None else "")
        version = self.jobbers_options.version
        when: datetime | None = None
        if delay > 0:
            data = payload.from_signature_options(sig.args, sig.kwargs, dict(sig.options))
            fields["msg"] = jobbers.recorder.encode(data)
            res = jobbers.recorder.retry_later(
                self._run(), reason=reason, delay_ms=round(delay * 1000), fields=fields,
                version=version, guard=self._terminal)
            when = datetime.now(UTC) + timedelta(seconds=delay)
        else:
            try:
                data = payload.from_signature_options(sig.args, sig.kwargs, dict(sig.options))
                fields["msg"] = jobbers.recorder.encode(data)
            except TypeError:
                pass  # not JSON: the record keeps the payload it had
            # the publish lease: should this process die before publishing, a scheduler
            # publishes the recorded payload once the lease expires
            res = jobbers.recorder.retry_now(self._run(), reason=reason, fields=fields,
                                             version=version, guard=self._terminal)
            if res.applied and res.state is S.UNSUBMITTED:
                # records unsubmitted -> submitted on publish
                jobbers.publisher.republish_signature(sig, leased=req.id)
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

    def _retry_delay(self, n: int, eta: datetime | None, countdown: float | None) -> float:
        opts = self.jobbers_options
        if eta is not None:
            aware = eta if eta.tzinfo else eta.replace(tzinfo=UTC)
            return max(0.0, (aware - datetime.now(UTC)).total_seconds())
        if countdown is not None:
            return max(0.0, float(countdown))
        if opts.retry_delay is None:
            return 0.0
        return compute_delay(opts.backoff_strategy, opts.retry_delay, n, opts.max_retry_delay)


def _seconds_until(countdown: Any, eta: Any) -> float:
    """Seconds a publish's ``countdown`` (which wins, as in Celery) or ``eta`` (naive: UTC)
    puts it off; 0 for neither, or one already past."""
    if countdown:
        return max(0.0, float(countdown))
    if not eta:
        return 0.0
    when = datetime.fromisoformat(eta) if isinstance(eta, str) else eta
    aware = when if when.tzinfo else when.replace(tzinfo=UTC)
    return max(0.0, (aware - datetime.now(UTC)).total_seconds())


def _id(req: Any) -> str:
    """The id of a tracked task's request (always set: see ``_tracked``)."""
    task_id: str = req.id
    return task_id
