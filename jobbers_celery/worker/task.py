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

The class is put together from its sides, one module each: the declaration and shared
plumbing (:mod:`~jobbers_celery.worker.taskbase`), what a body calls while it runs
(:mod:`~jobbers_celery.worker.taskbeat`), the publish and retry side
(:mod:`~jobbers_celery.worker.taskpublish`); this module holds the driver and the steps
that end an attempt.
"""

from __future__ import annotations

from typing import Any, NoReturn

from celery.exceptions import (
    Ignore,
    Reject,
    Retry,
    SoftTimeLimitExceeded,
)
from kombu.exceptions import EncodeError

from jobbers_celery.core import softlimit
from jobbers_celery.core.errors import AttemptSuperseded, TaskCancelled, TaskTimeout
from jobbers_celery.core.errortext import cut_head
from jobbers_celery.core.fairshare import ConcurrencyKeyError
from jobbers_celery.core.options import DeadLetterPolicy, ShutdownPolicy
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.ratelimit import RateLimitKeyError
from jobbers_celery.lifecycle import liveness, payload, results
from jobbers_celery.store import UNREACHABLE, ResultWrite
from jobbers_celery.telemetry import metrics
from jobbers_celery.worker import heartbeat as hb
from jobbers_celery.worker import shutdown
from jobbers_celery.worker.heartbeat import (
    CHECKPOINT_MAX_BYTES,
    HEARTBEAT_MIN_GAP_S,
    PROGRESS_MAX_BYTES,
    request_getter,
)
from jobbers_celery.worker.outage import HEADER_GIVEN_BACK, STORE_OUTAGE
from jobbers_celery.worker.shutdown import WorkerShuttingDown
from jobbers_celery.worker.start import start_keys
from jobbers_celery.worker.taskbase import (
    ATTEMPT,
    RUN,
    Revoked,
    S,
    ends_cancelled,
    request_id,
)
from jobbers_celery.worker.taskbeat import HeartbeatMixin
from jobbers_celery.worker.taskpublish import PublishMixin

__all__ = ["CHECKPOINT_MAX_BYTES", "DROP_ON_COMPLETION", "HEADER_GIVEN_BACK", "HEARTBEAT_MIN_GAP_S",
           "PROGRESS_MAX_BYTES", "JobbersTask", "Revoked"]

log = escaped_logger("jobbers.task")

#: What a call whose arguments give no flow-control key fails with.
StartKeysError = RateLimitKeyError | ConcurrencyKeyError

#: The request reader ``heartbeat()`` uses (its tests reach it here).
_request_getter = request_getter

#: Request attributes jobbers sets on a running task's context (more in taskbase).
_CHECKPOINT = hb.CHECKPOINT
_DONE = hb.DONE
_STORING = "jobbers_storing"  # returned; completed once Celery's tracer stores the result

#: Record fields a completed task no longer needs (the payload, the running attempt's
#: bookkeeping): dropping them keeps the finished record small.
DROP_ON_COMPLETION = ("msg", "wid", "hb_iv", "srec")
#: Signatures of a replacement canvas looked at to find the task taking the replaced id.
_CANVAS_WALK_MAX = 10_000
#: History reasons of the ways a task body ends an attempt without a return.
IGNORED = "ended by Ignore (Celery stores no result)"
UNSENT_RETRY = "raised Retry without sending a new message: nothing runs it again"


class JobbersTask(HeartbeatMixin, PublishMixin):
    """Base class for tracked tasks: ``@app.task(base=JobbersTask, ...)``.

    Its options (``max_retries``, ``retry_delay``, ``timeout``, ...) are declared on
    :class:`~jobbers_celery.worker.taskbase.TaskBase`, and read once per subclass."""

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
            keyless = self._start()
            if keyless is not None:
                log.error("not running %s[%s]: %s", self.name, self.request.id, keyless)
                if self._fail(keyless, reason=f"not run: {keyless}"):
                    raise Revoked("cancellation requested") from keyless
                raise keyless
            try:
                with softlimit.allowed():
                    result = self.run(*args, **kwargs)
            except Retry as exc:
                if not getattr(self.request, _DONE, False):
                    self._unsent_retry(exc)  # raised by the body, not by self.retry()
                raise
            except Ignore:
                if not getattr(self.request, _DONE, False):
                    self._ignored()  # raised by the body, not by jobbers nor replace()
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
                    raise self._retry(None, None, exc, True, None, None, None, {},
                                      own=True) from exc
                if self._fail(exc, reason="unexpected exception"):
                    raise Revoked("cancellation requested") from exc
                raise
            self._complete(result)
            return result

    # ------------------------------------------------------------------ steps
    def _start(self) -> StartKeysError | None:
        """Record the start; returns the key error of a call whose arguments give no key
        for a flow control the task declares (it is recorded started without the control,
        and must fail with that error, see :class:`~.start.StartKeys`)."""
        parts = self._parts()
        req = self.request
        delivery = self._delivery()
        keys = start_keys(delivery, self.jobbers_options)
        try:
            res = parts.starter.start(delivery, self.jobbers_options, keys)
        except UNREACHABLE:
            parts.handover.give_back(delivery)
        STORE_OUTAGE.over()
        if ends_cancelled(res):
            log.info("not running %s[%s]: it was cancelled", self.name, req.id)
            raise Revoked("cancelled before it ran")
        if not res.applied:
            log.warning("not running %s[%s]: it is %s (duplicate or stale delivery)",
                        self.name, req.id, res.previous)
            raise Ignore()
        if res.state is S.SCHEDULED:
            log.info("deferring %s[%s]: max_concurrent%s or rate_limit_by (its history says "
                     "which, and until when)", self.name, req.id,
                     " per key (parked)" if self.jobbers_options.concurrency_key else "")
            raise Ignore()
        setattr(req, ATTEMPT, res.attempt)
        ckpt = res.values.get("ckpt")
        setattr(req, _CHECKPOINT, payload.loads(ckpt) if ckpt else None)
        setattr(req, RUN, parts.recorder.running(
            res, request_id(req), self.name, self._worker(), liveness.worker_id(),
            published_ms=metrics.ms_value(
                payload.request_header(req, payload.HEADER_PUBLISHED_AT)),
            enqueued_ms=metrics.ms_value(
                payload.request_header(req, payload.HEADER_ENQUEUED_AT))))
        return keys.error

    def _complete(self, retval: Any) -> None:
        """Record ``completed``: with Celery's result write in the same script when it can
        (folded), else after Celery's tracer has stored the result.

        Folded: one atomic step, and a completion refused because another attempt or
        outcome owns the record writes no result either (the tracer is told not to store
        it). A result the backend cannot encode is recorded ``failed`` with the encode
        error, which the tracer then stores as FAILURE, as Celery does.

        Not folded (results on another server, another backend, a chord, callbacks or a
        chain): the completion is recorded after Celery's write (:meth:`_result_stored`,
        from ``task_success``; :meth:`_result_not_stored` from ``task_failure`` when the
        write failed), so the record follows what Celery stored. A process killed between
        the two leaves the record ``started`` beside a stored SUCCESS, which the worker's
        main process records ``completed`` (:mod:`~jobbers_celery.worker.request`); a
        completion refused then (the attempt was declared stalled meanwhile) leaves the
        SUCCESS stored. With no result to store (``ignore_result``, no backend) it is
        recorded at once.
        """
        req = self.request
        setattr(req, _DONE, True)
        parts = self._parts()
        try:
            write = parts.fold_result(self, retval)
        except EncodeError as exc:
            if self._result_not_stored(exc):
                raise Revoked("cancellation requested") from exc
            raise
        if write is None and results.stored_by_celery(self):
            setattr(req, _STORING, True)  # recorded once the tracer has stored it
            return
        self._record_completion(write)

    def _result_stored(self) -> None:
        """Celery stored this attempt's result (``task_success``, in the process that ran
        it): record the completion that :meth:`_complete` left to it."""
        req = self.request
        if not getattr(req, _STORING, False):
            return
        setattr(req, _STORING, False)
        with softlimit.shielded():
            self._record_completion(None, stored=True)

    def _result_not_stored(self, exc: BaseException) -> bool:
        """The attempt returned, but its result could not be stored (the backend could not
        encode it, or refused it): Celery stores FAILURE with ``exc``, and the record says
        ``failed`` with it (from ``task_failure`` in the process that ran it, or from
        :meth:`_complete` for a write folded into the completion). Returns whether a
        pending cancellation ended it ``cancelled`` instead."""
        setattr(self.request, _STORING, False)
        self._redact(exc)
        with softlimit.shielded():
            return self._fail(exc, reason="its result could not be stored")

    def _storing_result(self) -> bool:
        """Whether this attempt's completion waits for Celery's result write."""
        return bool(getattr(self.request, _STORING, False))

    def _record_completion(self, write: ResultWrite | None, stored: bool = False) -> None:
        """The ``completed`` step (``write``: Celery's result folded into it; ``stored``:
        Celery's tracer has stored the result already)."""
        req = self.request
        parts = self._parts()
        run, recorder, fields = self._run(), parts.recorder, self._pending_checkpoint()
        res = self._ending()(lambda: recorder.complete(run, fields=fields,
                                                       drop=DROP_ON_COMPLETION, write=write))
        if not res.applied:
            log.warning("late completion of %s[%s] attempt %s rejected: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
            if stored:
                if res.previous not in ("missing", S.COMPLETED.value):
                    # another attempt or outcome owns the record: take back the result
                    # just stored, as the folded write would not have written it
                    results.forget(self, request_id(req))
                return
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
        return ends_cancelled(res)

    def _ignored(self) -> None:
        """The body raised Celery's ``Ignore`` (often after ``update_state``): the attempt
        ended by itself without a result, which Celery does not store: ``completed``, with
        the reason (nothing runs it again; the result backend keeps what the task wrote)."""
        req = self.request
        setattr(req, _DONE, True)
        run, recorder, fields = self._run(), self._parts().recorder, self._pending_checkpoint()
        res = self._ending()(lambda: recorder.complete(run, fields=fields,
                                                       drop=DROP_ON_COMPLETION, write=None,
                                                       reason=IGNORED))
        if not res.applied:
            log.warning("end of %s[%s] attempt %s by Ignore not recorded: the task is %s",
                        self.name, req.id, self.attempt, res.previous)

    def _unsent_retry(self, exc: Retry) -> None:
        """The body raised ``Retry`` itself, without ``self.retry()``: no new message was
        sent, so Celery marks the result RETRY and nothing runs the task again: ``failed``
        (dead-lettered per its policy, so that it can be resubmitted), with the reason."""
        cause = exc.exc if isinstance(exc.exc, BaseException) else exc
        self._redact(cause)
        if self._fail(cause, reason=UNSENT_RETRY):
            raise Revoked("cancellation requested") from exc

    # ------------------------------------------------------------------ replace
    def on_replace(self, sig: Any) -> Any:
        """Celery's ``replace()`` ends here with ``sig`` frozen with this task's id.

        In a worker the attempt ends in the record before ``sig`` is published: the task
        taking the id (the carrier) is tracked (a JobbersTask, or unknown here): ``started
        -> unsubmitted`` ("replaced by <name>"), and the carrier's publish records
        ``unsubmitted -> submitted`` under its own name and queue (at once for a task or
        a chain it starts, when the chain reaches it otherwise). It is not (a plain task,
        ``celery.accumulate`` for a group): ``completed`` once ``sig`` is published, its
        outcome is Celery's. Eager or called directly: Celery's own.
        """
        if not self._tracked():
            return super().on_replace(sig)
        with softlimit.shielded():  # record and publish without interruption
            self._replace(sig)

    def _replace(self, sig: Any) -> NoReturn:
        req = self.request
        setattr(req, _DONE, True)
        carrier = _carrier(sig, request_id(req))
        shown = cut_head(carrier or "the replacement", 200)
        parts = self._parts()
        run, recorder, ending = self._run(), parts.recorder, self._ending()
        known = self.app.tasks.get(carrier) if carrier else None
        if known is None or isinstance(known, JobbersTask):
            res = ending(lambda: recorder.replaced(run, reason=f"replaced by {shown}"))
            if res.applied and res.state is S.UNSUBMITTED:
                sig.delay()  # the carrier's publish (or the chain's first) records it
                parts.publisher.confirm([request_id(req)])
            elif res.applied and res.state is S.CANCELLED:
                log.info("%s[%s] was cancelled: not replaced", self.name, req.id)
                raise Revoked("cancellation requested")
            else:
                log.warning("replace of %s[%s] attempt %s not recorded: the task is %s; "
                            "its replacement is not published", self.name, req.id,
                            self.attempt, res.previous)
        else:
            sig.delay()
            fields = self._pending_checkpoint()
            reason = f"replaced by {shown} (not tracked: Celery's result tells its outcome)"
            done = ending(lambda: recorder.complete(run, fields=fields,
                                                    drop=DROP_ON_COMPLETION, write=None,
                                                    reason=reason))
            if not done.applied:
                log.warning("replace of %s[%s] attempt %s not recorded: the task is %s",
                            self.name, req.id, self.attempt, done.previous)
        raise Ignore("Replaced by new task")

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
        if ends_cancelled(res):
            # a revoke with terminate (its cancellation was recorded before the signal),
            # or cancel(terminate=True): cancelled whatever on_shutdown says, no dead letter
            raise Revoked("cancellation honoured: interrupted by its worker")
        if not res.applied:
            log.info("%s[%s] interrupted; its record had moved on (%s)", self.name, req.id,
                     res.previous)
        raise Ignore()

    def _on_reject(self, exc: Reject) -> None:
        if getattr(exc, "requeue", False) and not self.acks_late:
            # The message was acknowledged when the task started: Celery has nothing to hand
            # back and nothing runs the task again (its result stays PENDING). The attempt
            # ended; left unsubmitted, the record would wait for a run that never comes.
            self._fail(exc, reason="rejected with requeue, but its message was acknowledged "
                                   "when it started (no acks_late): nothing runs it again")
        elif getattr(exc, "requeue", False):
            # The broker hands the message back; its next start records a new submission.
            setattr(self.request, _DONE, True)
            self._parts().recorder.requeue(self._run(), reason="rejected with requeue")
        else:
            why = getattr(exc, "reason", None)
            cause = why if isinstance(why, BaseException) else RuntimeError(f"rejected: {why!r}")
            self._fail(cause, reason="rejected")



def _carrier(sig: Any, task_id: str) -> str | None:
    """The name of the task in canvas ``sig`` that carries ``task_id`` (``replace()``
    froze ``sig`` with it: a task itself, a chain's last task, a chord's body), or
    ``None`` if none does (bounded walk)."""
    todo, seen = [sig], 0
    while todo and seen < _CANVAS_WALK_MAX:
        node = todo.pop()
        seen += 1
        if isinstance(node, (list, tuple)):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        inner = node.get("kwargs") if node.get("subtask_type") else None
        if isinstance(inner, dict):
            todo.extend(inner[k] for k in ("tasks", "header", "body") if k in inner)
        elif (node.get("options") or {}).get("task_id") == task_id:
            name = node.get("task")
            return str(name) if name else None
    return None
