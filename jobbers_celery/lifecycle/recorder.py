"""The recorder: the one place that turns an outcome into a store step, its metrics and its
dead letter.

Every lifecycle step of jobbers goes through a named method here (``publish``, ``start``,
``complete``, ``fail``, ``retry_later``, ``requeue``, ``stop``, ``drop``, ``cancel`` and the
resubmits), so that "step, then metrics, then dead letter" is written once per outcome and
read in one file. Nothing here decides an outcome: the task class decides (which outcome,
which delay) and the recorder records the one decided, as Procrastinate's ``JobManager``
records what its worker decided. It receives what it uses (the store, the dead-letter
dispatcher, two limits), never the whole ``Jobbers``.

The submit side (``publish``, ``publish_later``, ``never_sent``, ``late_submit``) is
:mod:`jobbers_celery.lifecycle.submits`, which the recorder extends: a publishing process
records no more than that.

The task's start and completion are the hot path: one store round trip each, no read
before or after, the per-attempt values kept on one :class:`Run` built at the start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jobbers_celery.core import errortext
from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.ratelimit import RateKey
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.states import RESUBMITTABLE, TERMINAL, TaskState
from jobbers_celery.core.unique import HEADER_UNIQUE, parse_field
from jobbers_celery.core.workflow import links_of_options
from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
from jobbers_celery.deadletter.entry import DEAD_LETTER_FIELDS, dead_letter_entry
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle.submits import (
    ERROR_MESSAGE_MAX_CHARS,
    SubmitRecorder,
    error_fields,
    publishing,
)
from jobbers_celery.store import CancelOutcome, Giver, ResultWrite, StepResult, StepStore
from jobbers_celery.telemetry import metrics

__all__ = [
    "ERROR_MESSAGE_MAX_CHARS",
    "Recorder",
    "Run",
    "error_fields",
    "publishing",
]

log = escaped_logger("jobbers.lifecycle")

S = TaskState
#: The states of a record whose attempt's end is recorded.
_ENDED = frozenset(state.value for state in TERMINAL)


class Run:
    """One running attempt, as its ending steps and metrics need it: built once, when its
    start is recorded, and kept on the task's request."""

    __slots__ = ("attempt", "enqueued_ms", "name", "queue", "started_ms", "task_id", "wid",
                 "worker")

    def __init__(self, task_id: str, name: str, attempt: int, worker: str | None, wid: str,
                 queue: str | None, started_ms: float | None,
                 enqueued_ms: float | None) -> None:
        self.task_id = task_id
        self.name = name
        self.attempt = attempt
        self.worker = worker  # the worker's hostname, shown on the record
        self.wid = wid  # the worker incarnation (see liveness)
        self.queue = queue
        self.started_ms = started_ms  # Redis time of the start
        self.enqueued_ms = enqueued_ms  # Redis time of the first enqueue (header)


def _said(exc: BaseException) -> str:
    """``exc`` as a step's reason quotes it: its type and message, cut."""
    return errortext.cut_head(f"{type(exc).__name__}: {exc}", 300)


def _refused(res: StepResult, task_id: str, to: TaskState, fence: int | None) -> None:
    """Log a step refused (the store was told to expect it): at debug when the attempt's
    end is recorded already (a second report of it, or a step of the pool process after its
    main process recorded how the attempt ended: the record is terminal), else as the store
    logs any refusal, a warning (another attempt, another worker, an unexpected state)."""
    if res.applied:
        return
    routine = res.why == "state" and res.previous in _ENDED
    log.log(logging.DEBUG if routine else logging.WARNING,
            "refused transition %s -> %s of task %s (%s, attempt %s, fence %s)",
            res.previous, to.value, task_id, res.why, res.attempt, fence)


class Recorder(SubmitRecorder):
    """Records outcomes: the only caller of the store's lifecycle step (its submit side is
    :class:`~jobbers_celery.lifecycle.submits.SubmitRecorder`'s)."""

    def __init__(self, store: StepStore, dead_letters: DeadLetterDispatcher, *,
                 payload_warn_bytes: int = 0, publish_lease_s: float = 30.0,
                 codec: PayloadCodec | None = None,
                 index: Callable[[str, Any, Any], list[str]] | None = None) -> None:
        """``index``: the argument-index digests of a publish (name, args, kwargs; see
        :mod:`jobbers_celery.lifecycle.search`), written by its own submit step."""
        super().__init__(store, payload_warn_bytes=payload_warn_bytes,
                         publish_lease_s=publish_lease_s, codec=codec, index=index)
        self.dead_letters = dead_letters

    # ------------------------------------------------------------------ start
    def start(self, task_id: str, name: str, *, worker: str | None, wid: str,
              heartbeat_ms: int | None, cap: int | None, lease_cap_ms: int, defer_ms: int,
              fields: dict[str, str], rate: RateKey | None = None,
              fair: FairKey | None = None) -> StepResult:
        """``submitted -> started`` (or ``scheduled`` past ``cap`` or ``rate``'s limit, or
        past ``fair``'s cap of its key, or ``cancelled``)."""
        return self.store.start(
            task_id, name=name, worker=worker, wid=wid, heartbeat_ms=heartbeat_ms, cap=cap,
            lease_cap_ms=lease_cap_ms, defer_ms=defer_ms, fields=fields, rate=rate, fair=fair,
        )

    def running(self, res: StepResult, task_id: str, name: str, worker: str | None, wid: str,
                published_ms: float | None, enqueued_ms: float | None) -> Run:
        """The start ``res`` applied: its metrics, and the attempt's :class:`Run`."""
        queue = res.values.get("queue") or None
        metrics.selected(name, queue, metrics.ROLE_WORKER,
                         res.now_ms - published_ms if published_ms is not None else None)
        return Run(task_id, name, res.attempt, worker, wid, queue, res.now_ms, enqueued_ms)

    def take_back(self, task_id: str, name: str, *, attempt: int, giver: str,
                  worker: str | None, judge: Giver) -> StepResult:
        """End the start a worker incarnation ``giver`` recorded but never ran (it gave the
        message back in a store outage): ``started -> unsubmitted``, only if ``giver`` is
        gone (``judge``; the message's word alone is never enough: refused ``giver_alive``
        or ``giver_runs_it`` otherwise)."""
        return self.store.end(
            task_id, S.UNSUBMITTED, fence=attempt, wid_fence=giver, wid=giver, name=name,
            worker=worker, lease_ms=self.publish_lease_ms, giver=judge, expect_refusal=True,
            reason="its start was recorded but never ran: the worker gave the message back "
                   "(the state store did not answer)",
        )

    def take_back_stall(self, task_id: str, name: str, *, attempt: int, giver: str,
                        worker: str | None) -> StepResult:
        """The same for a start its giver's worker stalled meanwhile as an end not recorded
        (the giver's request was over, the task not running there): ``stalled ->
        submitted``, fenced by that attempt and worker, and only if the cleaner's verdict on
        that attempt was its own worker's word that it does not run it (``gone_fence``)."""
        return self.store.step(
            task_id, S.SUBMITTED, sources=(S.STALLED,), fence=attempt, wid_fence=giver,
            gone_fence=True, name=name, worker=worker,
            reason="its start was recorded but never ran: the worker gave the message back "
                   "(the state store did not answer); it was stalled as an end not recorded",
        )

    # ------------------------------------------------------------------ an attempt ends
    # The worker runs each of these whole under its outage policy (``worker.outage.Ending``),
    # which may call it again (a store outage, a start the store lost): so each does nothing
    # before its one store step, and nothing after it unless the step applied (the step is
    # fenced by the attempt: a second try of one that applied is refused).
    def _ended(self, run: Run, res: StepResult, status: str) -> None:
        """Metrics of the step ``res`` that ended ``run`` (if it applied): ``status``, or
        ``cancelled`` when a pending cancellation redirected the step."""
        if res.applied:
            metrics.attempt_ended(
                run.name, run.queue, S.CANCELLED.value if res.state is S.CANCELLED else status,
                now_ms=res.now_ms, started_ms=run.started_ms, enqueued_ms=run.enqueued_ms)

    def complete(self, run: Run, *, fields: dict[str, str], drop: Sequence[str],
                 write: ResultWrite | None, reason: str | None = None) -> StepResult:
        """``started -> completed`` (with Celery's result written by the same script);
        ``reason``: how it ended otherwise than by returning (an ``Ignore``, a replace)."""
        res = self.store.complete(
            run.task_id, run.attempt, name=run.name, worker=run.worker, wid=run.wid,
            fields=fields, delete=drop, write_result=write, reason=reason,
        )
        self._ended(run, res, S.COMPLETED.value)
        return res

    def fail(self, run: Run, exc: BaseException, *, reason: str, fields: dict[str, str],
             dead_letter: bool) -> StepResult:
        """``started -> failed`` (``cancelled`` if cancellation was pending), then its dead
        letter when the task saves them."""
        res = self.store.end(
            run.task_id, S.FAILED, fence=run.attempt, worker=run.worker, reason=reason,
            fields={**fields, **error_fields(exc)}, ret=DEAD_LETTER_FIELDS, wid=run.wid,
            name=run.name, cancellable=True,
        )
        self._ended(run, res, S.FAILED.value)
        if dead_letter and res.applied and res.state is S.FAILED:
            self._dead_letter(run.task_id, run.name, "failed", res, exc=exc, worker=run.worker)
        return res

    def cancel(self, run: Run, *, reason: str) -> StepResult:
        """``started -> cancelled``: the task honoured its cancellation."""
        res = self.store.end(
            run.task_id, S.CANCELLED, fence=run.attempt, worker=run.worker, reason=reason,
            wid=run.wid, name=run.name,
        )
        self._ended(run, res, S.CANCELLED.value)
        return res

    def retry_later(self, run: Run, *, reason: str, delay_ms: int, fields: dict[str, str],
                    version: int | None) -> StepResult:
        """``started -> scheduled``: the retry waits ``delay_ms`` in the store."""
        res = self.store.end(
            run.task_id, S.SCHEDULED, fence=run.attempt, worker=run.worker, reason=reason,
            delay_ms=delay_ms, fields=fields, wid=run.wid, name=run.name, cancellable=True,
        )
        self._retried(run, res, version)
        return res

    def retry_now(self, run: Run, *, reason: str, fields: dict[str, str],
                  version: int | None) -> StepResult:
        """``started -> unsubmitted`` with a publish lease: the caller publishes the retry
        (should it die first, a scheduler publishes the recorded payload once the lease
        expires)."""
        res = self._requeue_step(run, reason, fields, self.publish_lease_ms, True, None)
        self._retried(run, res, version)
        return res

    def replaced(self, run: Run, *, reason: str) -> StepResult:
        """``started -> unsubmitted`` with a publish lease: the task replaced itself
        (Celery's ``replace()``) by a task that takes its id; that task's publish records
        ``unsubmitted -> submitted`` under its own name, and the caller confirms the lease
        once the replacement is published (should it die first, a scheduler publishes the
        recorded payload: the replaced task runs again). Cancellable: a pending
        cancellation ends it ``cancelled`` (the caller then publishes nothing). The mark
        ``rpl`` lets that publish, and only it, rewrite the record's name and queue."""
        res = self._requeue_step(run, reason, {"rpl": "1"}, self.publish_lease_ms, True, None)
        self._ended(run, res, S.COMPLETED.value)  # the attempt did its part: it handed over
        return res

    def _retried(self, run: Run, res: StepResult, version: int | None) -> None:
        self._ended(run, res, metrics.STATUS_RETRIED)
        if res.applied and res.state is not S.CANCELLED:
            metrics.retried(run.name, version, run.queue)

    def requeue(self, run: Run, *, reason: str, fields: dict[str, str] | None = None,
                lease: bool = False, cancel_reason: str | None = None) -> StepResult:
        """``started -> unsubmitted`` without using a retry (``Reject(requeue=True)``, or
        ``on_shutdown=resubmit``, then with a publish lease and cancellable). Refused
        because the attempt ended already (see :func:`_refused`): logged at debug."""
        res = self._requeue_step(run, reason, fields or {},
                                 self.publish_lease_ms if lease else None, lease,
                                 cancel_reason, expect_refusal=True)
        _refused(res, run.task_id, S.UNSUBMITTED, run.attempt)
        self._ended(run, res, metrics.STATUS_RESUBMITTED)
        return res

    def _requeue_step(self, run: Run, reason: str, fields: dict[str, str],
                      lease_ms: int | None, cancellable: bool,
                      cancel_reason: str | None, expect_refusal: bool = False) -> StepResult:
        return self.store.end(
            run.task_id, S.UNSUBMITTED, fence=run.attempt, worker=run.worker, reason=reason,
            fields=fields, wid=run.wid, name=run.name, cancellable=cancellable,
            cancel_reason=cancel_reason, lease_ms=lease_ms, expect_refusal=expect_refusal,
        )

    def stop(self, run: Run, *, reason: str, fields: dict[str, str], cancel_reason: str,
             dead_letter: bool) -> StepResult:
        """``started -> stalled``: the worker shut down under ``on_shutdown=stop`` (or
        interrupted the task: a hard time limit, whose failure its main process records
        first: that refusal is logged at debug, see :func:`_refused`)."""
        res = self.store.end(
            run.task_id, S.STALLED, fence=run.attempt, worker=run.worker, reason=reason,
            fields={**fields, **error_fields(None, reason)}, ret=DEAD_LETTER_FIELDS,
            wid=run.wid, name=run.name, cancellable=True, cancel_reason=cancel_reason,
            expect_refusal=True,
        )
        _refused(res, run.task_id, S.STALLED, run.attempt)
        self._ended(run, res, S.STALLED.value)
        if dead_letter and res.applied and res.state is S.STALLED:
            self._dead_letter(run.task_id, run.name, "stalled", res, message=reason,
                              worker=run.worker)
        return res

    # ------------------------------------------------------------------ the worker's main process
    def fail_reported(self, task_id: str, name: str, *, wid: str, exc: BaseException | None,
                      traceback: str | None, worker: str | None, enqueued_ms: float | None,
                      dead_letter: bool) -> StepResult:
        """A failure the worker's main process reports (a lost pool child, a hard time
        limit, a ``Reject`` without requeue): ``started -> failed``, fenced by the worker
        incarnation. Celery reports some twice (a hard time limit: as the pool's error and
        from ``on_timeout``) and some the task recorded itself (``Reject``): a refusal
        because the attempt ended already is logged at debug (see :func:`_refused`)."""
        res = self.store.end(
            task_id, S.FAILED, wid_fence=wid, wid=wid, name=name, worker=None,
            reason=f"{type(exc).__name__} reported by the worker", cancellable=True,
            fields=error_fields(exc), ret=(*DEAD_LETTER_FIELDS, *metrics.ATTEMPT_FIELDS),
            expect_refusal=True,
        )
        _refused(res, task_id, S.FAILED, None)
        self._reported(name, res, S.FAILED.value, enqueued_ms)
        if dead_letter and res.applied and res.state is S.FAILED:
            self._dead_letter(task_id, name, "failed", res, exc=exc, traceback=traceback,
                              worker=worker)
        return res

    def requeue_reported(self, task_id: str, name: str, *, wid: str, exc: BaseException,
                         why: str) -> StepResult:
        """``started -> unsubmitted -> submitted`` from the worker's main process: the task
        failed there (``why``: its pool process was lost) and Celery hands its message back
        to the broker to run again (``acks_late`` with ``reject_on_worker_lost`` or
        ``on_worker_lost="rerun"``).
        Fenced by the worker incarnation; a pending cancellation ends it ``cancelled``
        instead (the redelivered copy then does not run); a refusal is routine (the process
        was lost before its start was recorded: the copy starts as any delivery). Recorded
        before the message is handed back, so that the copy's start is the next attempt."""
        res = self._lost(task_id, name, wid, exc, f"{why} ({_said(exc)}); the message goes back "
                         "to the broker to run again")
        if res.applied and res.state is S.UNSUBMITTED:
            self.requeued(task_id, name)
        return res

    def retry_reported(self, task_id: str, name: str, *, wid: str,
                       exc: BaseException) -> StepResult:
        """``started -> unsubmitted`` from the worker's main process: the task's pool process
        was lost and Celery retries it (``retry_on_worker_lost``, Celery 5.7): it publishes
        the retry next, through the task's ``apply_async``, which records the submission
        (``scheduled`` first when ``default_retry_delay`` is set). Without this step the
        record was still ``started``: the retry was refused as a duplicate and never ran.
        Fenced by the worker incarnation; a pending cancellation ends it ``cancelled``; a
        refusal is routine (the process was lost before its start was recorded)."""
        return self._lost(task_id, name, wid, exc, f"its worker process was lost ({_said(exc)}); "
                          "Celery retries it (retry_on_worker_lost)")

    def _lost(self, task_id: str, name: str, wid: str, exc: BaseException,
              reason: str) -> StepResult:
        """``started -> unsubmitted`` of an attempt whose pool process was lost, fenced by the
        worker incarnation, ``cancelled`` instead if a cancellation is pending."""
        res = self.store.end(
            task_id, S.UNSUBMITTED, wid_fence=wid, wid=wid, name=name, worker=None,
            reason=reason, cancellable=True, fields=error_fields(exc),
            ret=metrics.ATTEMPT_FIELDS, expect_refusal=True)
        self._reported(name, res, metrics.STATUS_RESUBMITTED)
        return res

    def requeued(self, task_id: str, name: str) -> StepResult:
        """``unsubmitted -> submitted``: the worker's main process hands the message of a
        task whose attempt ended ``unsubmitted`` back to the broker (``Reject(requeue=True)``,
        a lost worker process). A refusal is routine (a pending cancellation ended it)."""
        return self.store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,), name=name,
                               reason="requeued by the worker", expect_refusal=True)

    def complete_reported(self, task_id: str, name: str, *, wid: str,
                          drop: Sequence[str]) -> StepResult:
        """``started -> completed`` from the worker's main process: the pool process stored
        the task's result (Celery's backend says SUCCESS) and was lost before it recorded
        the completion. Fenced by the worker incarnation; a refusal is routine (the
        completion was recorded, with the result or just after it)."""
        res = self.store.step(
            task_id, S.COMPLETED, sources=(S.STARTED,), wid_fence=wid, wid=wid, name=name,
            delete=drop, expect_refusal=True, ret=metrics.ATTEMPT_FIELDS,
            reason="its result was stored, then its worker process was lost before the "
                   "completion was recorded")
        self._reported(name, res, S.COMPLETED.value)
        return res

    def interrupted(self, task_id: str, name: str, *, wid: str, signum: Any,
                    worker: str | None, enqueued_ms: float | None) -> StepResult:
        """``started -> cancelled``: the worker interrupted the task (usually recorded
        already by the task itself, on its way out: a refusal is routine)."""
        res = self.store.end(
            task_id, S.CANCELLED, wid_fence=wid, wid=wid, name=name,
            reason=f"interrupted by the worker (signal {signum})", worker=worker,
            expect_refusal=True, ret=metrics.ATTEMPT_FIELDS)
        self._reported(name, res, S.CANCELLED.value, enqueued_ms)
        return res

    @staticmethod
    def _reported(name: str, res: StepResult, status: str,
                  enqueued_ms: float | None = None) -> None:
        """Metrics of a step the worker's main process recorded (if it applied), from the
        fields the step returned: ``status``, or ``cancelled`` when a pending cancellation
        redirected the step (as :meth:`_ended` for the pool process's)."""
        if res.applied:
            metrics.attempt_ended(
                name, res.values.get("queue"),
                S.CANCELLED.value if res.state is S.CANCELLED else status,
                now_ms=res.now_ms, started_ms=metrics.started_ms(res.values),
                enqueued_ms=enqueued_ms)

    def revoke_running(self, task_id: str, *, reason: str) -> CancelOutcome:
        """Celery's revoke with ``terminate`` reached the worker running the task: its
        cancellation is requested (``reason`` kept for the step that ends it), before the
        signal reaches the task, so that the attempt ends ``cancelled`` whatever its
        ``on_shutdown`` (or, where the pool cannot interrupt it, at its next heartbeat)."""
        return self.store.cancel(task_id, reason, keep_reason=True)

    def revoked(self, task_id: str, *, worker: str | None, expired: bool = False) -> StepResult:
        """``submitted -> cancelled``: Celery's revoke reached the worker before the task ran,
        or the message's ``expires`` had passed when the worker received it."""
        reason = ("expired: the worker did not run it (its expires had passed)" if expired
                  else "revoked: the worker did not run it")
        return self.store.unstarted(task_id, S.CANCELLED, reason=reason, worker=worker)

    def drop(self, task_id: str, name: str, *, reason: str, worker: str | None = None,
             exc: BaseException | None = None, enqueued_ms: float | None = None,
             dead_letter: bool = False) -> StepResult:
        """``submitted -> dropped``: the message is not run here (unknown task, not a
        jobbers task, another version); counts an attempt, so that its dead letter has its
        own attempt number."""
        res = self.store.unstarted(
            task_id, S.DROPPED, reason=reason, worker=worker,
            fields=error_fields(exc, None if exc is not None else reason),
            ret=DEAD_LETTER_FIELDS if dead_letter else ("queue",),
        )
        if res.applied:
            metrics.attempt_ended(name, res.values.get("queue"), S.DROPPED.value,
                                  now_ms=res.now_ms, enqueued_ms=enqueued_ms)
        if dead_letter and res.applied:
            self._dead_letter(task_id, name, "dropped", res, exc=exc,
                              message=None if exc is not None else reason, worker=worker)
        return res

    # ------------------------------------------------------------------ resubmits
    def not_resubmitted(self, task_id: str, why: str) -> StepResult:
        """A resubmit whose ``submitted`` step applied but that has nothing to publish:
        ``submitted -> dropped`` at once (no dead letter: the entry is there already), so
        that the record does not wait for a publish that cannot come."""
        return self.store.unstarted(
            task_id, S.DROPPED, reason=f"not resubmitted: {why}, so it cannot be published "
                                       "again")

    def resubmit(self, task_id: str, reset_retry_count: bool,
                 version: int | None = None) -> StepResult:
        """A failed, stalled, dropped or cancelled task back to ``submitted`` (with a
        publish lease), its payload returned for the publisher; refused ``no_msg`` if the
        record holds no payload (its dead-letter entry does). ``version``: publish it as
        this version (the current one) instead of the one it has."""
        fields = {"retries": "0"} if reset_retry_count else {}
        if version is not None:
            fields["ver"] = str(version)
        return self.store.submit(
            task_id, sources=RESUBMITTABLE, lease_ms=self.publish_lease_ms,
            reason=_resubmit_reason(reset_retry_count, version=version),
            fields=fields,
            ret=("msg", "retries", "name", "ver", "dlq"),
            # refused 'no_msg' when the record holds no payload (its dead letter does)
            need="msg",
            # a fresh start also gets its automatic stall recoveries back
            delete=("stalls",) if reset_retry_count else (),
        )

    def resubmit_entry(self, entry: DeadLetter, data: dict[str, Any], reset_retry_count: bool,
                       sources: frozenset[TaskState] | None, from_dlq: bool,
                       version: int | None = None) -> StepResult:
        """Resubmit with the payload ``data`` of a dead-letter ``entry``: a record that
        expired since is created again. ``version``: as this version (the current one)
        instead of the entry's."""
        fields = {"msg": pl.dumps(pl.seal_arguments(data, self.codec, stored=True)),
                  "retries": "0" if reset_retry_count else str(entry.retry_attempt)}
        if entry.checkpoint is not None:
            fields["ckpt"] = pl.dumps(entry.checkpoint)
        # a record created again counts its starts on from the entry's: the next failure is
        # a new attempt, not a duplicate of the dead-lettered one (a sink keeps one per
        # task id and attempt, and would drop it)
        create = {"name": entry.name, "queue": entry.queue or pl.queue_of(data["options"]),
                  "dlq": "1", "attempt": str(entry.attempt),
                  # a record made again is a member of its workflow again
                  **links_of_options(entry.task_id, data["options"])}
        uq = (data["options"].get("headers") or {}).get(HEADER_UNIQUE)
        if parse_field(uq) is not None:  # a unique task's record made again: takes its lock
            create["uq"] = str(uq)
        if version is not None:
            fields["ver"] = str(version)
        elif entry.version is not None:
            create["ver"] = str(entry.version)
        return self.store.submit(
            entry.task_id, sources=sources or RESUBMITTABLE | {S.UNSUBMITTED}, create=create,
            fields=fields, delete=("stalls",) if reset_retry_count else (),
            lease_ms=self.publish_lease_ms, name=entry.name,
            reason=_resubmit_reason(reset_retry_count, from_dlq=from_dlq, version=version,
                                    was=entry.version),
            ret=("retries", "name", "ver", "dlq"),
        )

    # ------------------------------------------------------------------ stalls (cleaner)
    def stalled(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Metrics of the attempts a stall verdict (``stall.lua``) ended."""
        for item in items:
            metrics.attempt_ended(item.get("name") or "", item.get("queue"), "stalled",
                                  now_ms=float(item.get("now") or 0),
                                  started_ms=metrics.ms_value(item.get("started")))

    def dead_letter_stalled(self, dead: Sequence[Mapping[str, Any]]) -> list[str]:
        """Build every dead letter of a stall verdict, then send them together (one round
        trip with a sink that has ``write_many``; a failed batch is written, or parked,
        entry by entry, see ``DeadLetterDispatcher.send_many``). Returns their task ids."""
        entries, ids = [], []
        for item in dead:
            if item.get("dlq") != "1":
                continue
            result = StepResult(applied=True, previous="started", now_ms=int(item["now"]),
                                attempt=int(item["attempt"]))
            try:
                entries.append(dead_letter_entry(
                    task_id=item["id"], name=item["name"], reason="stalled",
                    result=result, raw=item, message=item["reason"],
                    worker=item.get("worker") or None, codec=self.codec,
                ))
                ids.append(item["id"])
            except Exception:
                log.exception("could not dead-letter stalled task %s", item["id"])
        if not entries:
            return []
        try:
            self.dead_letters.send_many(entries)
        except Exception:
            log.exception("could not dead-letter %d stalled task(s): %s", len(ids), ids)
            return []
        return ids

    def _dead_letter(self, task_id: str, name: str, reason: str, result: StepResult, *,
                     exc: BaseException | None = None, message: str | None = None,
                     traceback: str | None = None, worker: str | None = None) -> None:
        """Write the dead letter of a task that just entered a terminal failure state, from
        the record fields its step returned (no extra read)."""
        self.dead_letters.send(dead_letter_entry(
            task_id=task_id, name=name, reason=reason, result=result, raw=result.values,
            exc=exc, message=message, traceback=traceback, worker=worker, codec=self.codec,
        ))


def _resubmit_reason(reset_retry_count: bool, *, from_dlq: bool = False,
                     version: int | None = None, was: int | None = None) -> str:
    reason = "resubmitted" + (" (retry count reset)" if reset_retry_count else "")
    if from_dlq:
        reason += " from the dead-letter queue"
    if version is not None:
        reason += f" as the current version {version}"
        if was is not None:
            reason += f" (the entry's was {was})"
    return reason

