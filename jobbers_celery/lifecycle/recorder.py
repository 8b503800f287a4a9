"""The recorder: the one place that turns an outcome into a store step, its metrics and its
dead letter.

Every lifecycle step of jobbers goes through a named method here (``publish``, ``start``,
``complete``, ``fail``, ``retry_later``, ``requeue``, ``stop``, ``drop``, ``cancel`` and the
resubmits), so that "step, then metrics, then dead letter" is written once per outcome and
read in one file. Nothing here decides an outcome: the task class decides (which outcome,
which delay) and the recorder records the one decided, as Procrastinate's ``JobManager``
records what its worker decided. It receives what it uses (the store, the dead-letter
dispatcher, two limits), never the whole ``Jobbers``.

The task's start and completion are the hot path: one store round trip each, no read
before or after, the per-attempt values kept on one :class:`Run` built at the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobbers_celery.core import errortext, intake
from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.states import RESUBMITTABLE, TaskState
from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
from jobbers_celery.deadletter.entry import DEAD_LETTER_FIELDS, dead_letter_entry
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle.publisher import internal_publish_ms, publishing_unrecorded
from jobbers_celery.store import CancelOutcome, Giver, ResultWrite, StepResult, StepStore
from jobbers_celery.telemetry import metrics, tracing

__all__ = [
    "ERROR_MESSAGE_MAX_CHARS",
    "Recorder",
    "Run",
    "error_fields",
]

log = escaped_logger("jobbers.lifecycle")

S = TaskState
_FROM_UNSUBMITTED = (S.UNSUBMITTED,)

#: Characters of an error message the record keeps (a dead letter keeps more, see
#: :mod:`jobbers_celery.core.errortext`): an exception that quotes a big argument must not put
#: another copy of it on the record.
ERROR_MESSAGE_MAX_CHARS = 1024

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


def error_fields(exc: BaseException | None, message: str | None = None) -> dict[str, str]:
    if exc is None:
        return {"err": pl.dumps({"type": "", "message": _clip(message or "")})}
    type_name, text, _ = pl.describe_exception(exc, message_max=ERROR_MESSAGE_MAX_CHARS)
    return {"err": pl.dumps({"type": type_name, "message": _clip(message) if message else text})}


def _clip(text: str) -> str:
    return errortext.cut_head(text, ERROR_MESSAGE_MAX_CHARS)


class Recorder:
    """Records outcomes: the only caller of the store's lifecycle step."""

    def __init__(self, store: StepStore, dead_letters: DeadLetterDispatcher, *,
                 payload_warn_bytes: int = 0, publish_lease_s: float = 30.0,
                 codec: PayloadCodec | None = None) -> None:
        self.store = store
        self.dead_letters = dead_letters
        self.codec = codec  # seals the arguments of every payload and dead letter it writes
        self.payload_warn_bytes = payload_warn_bytes
        self.publish_lease_ms = int(publish_lease_s * 1000)

    # ------------------------------------------------------------------ publish
    def publish(
        self,
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
        too_long = intake.identity_over_limits(task_id, name)
        if too_long:  # never a key: its worker refuses it, and says so
            log.error("task %s[%s] not recorded: %s", errortext.cut_head(name, 200),
                      errortext.cut_head(str(task_id), 200), too_long)
            return
        headers.setdefault(pl.HEADER_TASK, name)
        if version is not None:
            # a resubmit states the version the task failed with; keep it
            headers.setdefault(pl.HEADER_VERSION, version)
        if dead_letter:
            headers[pl.HEADER_DEAD_LETTER] = 1
        if publishing_unrecorded():
            return  # the store is away: the message keeps the headers it was published with
        now = internal_publish_ms()
        epoch: str | None = None
        if now is None:
            tracing.stamp(headers)  # the trace its republishes continue (see tracing)
            payload = pl.from_publish(headers, body, exchange, routing_key, properties)
            if payload is None:
                log.warning("task %s[%s] uses a message protocol jobbers cannot record", name,
                            task_id)
                return
            queue = pl.queue_of(payload["options"])
            fields = {"msg": _encode_payload(payload, self.codec)}
            if headers.get("retries"):  # absent means 0: every byte of a record counts
                fields["retries"] = str(headers["retries"])
            elif len(fields["msg"]) > self.payload_warn_bytes > 0:  # first publish only
                _warn_large_payload(name, task_id, len(fields["msg"]), self.payload_warn_bytes)
            create = {"name": name, "queue": queue}
            if dead_letter:
                create["dlq"] = "1"
            if version is not None:
                create["ver"] = str(version)
            result = self.store.submit(task_id, sources=_FROM_UNSUBMITTED, create=create,
                                       fields=fields, reason="published", name=name)
            now, epoch = result.now_ms, result.epoch  # epoch: None if refused (not recorded)
        else:
            epoch = self.store.epoch(task_id, max_age=10.0)
        headers.setdefault(pl.HEADER_ENQUEUED_AT, now)
        headers[pl.HEADER_PUBLISHED_AT] = now
        if epoch:
            headers[pl.HEADER_EPOCH] = epoch

    def publish_later(self, task_id: str, name: str, payload: dict[str, Any], *,
                      version: int | None, dead_letter: bool, delay_ms: int,
                      reason: str) -> StepResult:
        """A first publish with a delay (``countdown``/``eta``): ``unsubmitted -> submitted
        -> scheduled`` in one step, with ``payload``, which the scheduler publishes when
        ``run_at`` comes, as for a delayed retry: no ETA message waits at the broker (where
        a Redis broker delivers it again after its visibility timeout). Raises
        ``TypeError`` if ``payload`` is not JSON. An id or name over the intake limits is not
        recorded (refused: the caller sends an ETA message, which its worker refuses)."""
        too_long = intake.identity_over_limits(task_id, name)
        if too_long:
            log.error("task %s[%s] not recorded: %s", errortext.cut_head(name, 200),
                      errortext.cut_head(task_id, 200), too_long)
            return StepResult(applied=False, previous="missing", now_ms=0, attempt=0,
                              why=too_long)
        msg = self.encode(payload)
        if len(msg) > self.payload_warn_bytes > 0:
            _warn_large_payload(name, task_id, len(msg), self.payload_warn_bytes)
        create = {"name": name, "queue": pl.queue_of(payload["options"])}
        if dead_letter:
            create["dlq"] = "1"
        if version is not None:
            create["ver"] = str(version)
        return self.store.submit(task_id, sources=_FROM_UNSUBMITTED, create=create,
                                 fields={"msg": msg}, reason="published", name=name,
                                 later=(delay_ms, reason))

    def encode(self, payload: dict[str, Any]) -> str:
        """``payload`` as the record keeps it: JSON, its arguments sealed when payload keys
        are set. Raises ``TypeError`` if it is not JSON."""
        return pl.dumps(pl.seal_arguments(payload, self.codec))

    def late_submit(self, task_id: str, name: str, version: int, queue: str, dead_letter: bool,
                    msg: str, retries: int) -> StepResult:
        """A worker records the submission of a message published without a record."""
        return self.store.submit(
            task_id, sources=_FROM_UNSUBMITTED,
            create={"name": name, "ver": str(version), "queue": queue,
                    "dlq": "1" if dead_letter else "0"},
            fields={"msg": msg, "retries": str(retries)},
            reason="recorded by the worker: no submission record", name=name,
        )

    # ------------------------------------------------------------------ start
    def start(self, task_id: str, name: str, *, worker: str | None, wid: str,
              heartbeat_ms: int | None, cap: int | None, lease_cap_ms: int, defer_ms: int,
              fields: dict[str, str]) -> StepResult:
        """``submitted -> started`` (or ``scheduled`` past ``cap``, or ``cancelled``)."""
        return self.store.start(
            task_id, name=name, worker=worker, wid=wid, heartbeat_ms=heartbeat_ms, cap=cap,
            lease_cap_ms=lease_cap_ms, defer_ms=defer_ms, fields=fields,
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
                 write: ResultWrite | None) -> StepResult:
        """``started -> completed`` (with Celery's result written by the same script)."""
        res = self.store.complete(
            run.task_id, run.attempt, name=run.name, worker=run.worker, wid=run.wid,
            fields=fields, delete=drop, write_result=write,
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

    def _retried(self, run: Run, res: StepResult, version: int | None) -> None:
        self._ended(run, res, metrics.STATUS_RETRIED)
        if res.applied and res.state is not S.CANCELLED:
            metrics.retried(run.name, version, run.queue)

    def requeue(self, run: Run, *, reason: str, fields: dict[str, str] | None = None,
                lease: bool = False, cancel_reason: str | None = None) -> StepResult:
        """``started -> unsubmitted`` without using a retry (``Reject(requeue=True)``, or
        ``on_shutdown=resubmit``, then with a publish lease and cancellable)."""
        res = self._requeue_step(run, reason, fields or {},
                                 self.publish_lease_ms if lease else None, lease,
                                 cancel_reason)
        self._ended(run, res, metrics.STATUS_RESUBMITTED)
        return res

    def _requeue_step(self, run: Run, reason: str, fields: dict[str, str],
                      lease_ms: int | None, cancellable: bool,
                      cancel_reason: str | None) -> StepResult:
        return self.store.end(
            run.task_id, S.UNSUBMITTED, fence=run.attempt, worker=run.worker, reason=reason,
            fields=fields, wid=run.wid, name=run.name, cancellable=cancellable,
            cancel_reason=cancel_reason, lease_ms=lease_ms,
        )

    def stop(self, run: Run, *, reason: str, fields: dict[str, str], cancel_reason: str,
             dead_letter: bool) -> StepResult:
        """``started -> stalled``: the worker shut down under ``on_shutdown=stop``."""
        res = self.store.end(
            run.task_id, S.STALLED, fence=run.attempt, worker=run.worker, reason=reason,
            fields={**fields, **error_fields(None, reason)}, ret=DEAD_LETTER_FIELDS,
            wid=run.wid, name=run.name, cancellable=True, cancel_reason=cancel_reason,
        )
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
        limit): ``started -> failed``, fenced by the worker incarnation."""
        res = self.store.end(
            task_id, S.FAILED, wid_fence=wid, wid=wid, name=name, worker=None,
            reason=f"{type(exc).__name__} reported by the worker", cancellable=True,
            fields=error_fields(exc), ret=(*DEAD_LETTER_FIELDS, *metrics.ATTEMPT_FIELDS),
        )
        if res.applied:
            metrics.attempt_ended(
                name, res.values.get("queue"),
                S.CANCELLED.value if res.state is S.CANCELLED else S.FAILED.value,
                now_ms=res.now_ms, started_ms=metrics.started_ms(res.values),
                enqueued_ms=enqueued_ms)
        if dead_letter and res.applied and res.state is S.FAILED:
            self._dead_letter(task_id, name, "failed", res, exc=exc, traceback=traceback,
                              worker=worker)
        return res

    def interrupted(self, task_id: str, name: str, *, wid: str, signum: Any,
                    worker: str | None, enqueued_ms: float | None) -> StepResult:
        """``started -> cancelled``: the worker interrupted the task (usually recorded
        already by the task itself, on its way out: a refusal is routine)."""
        res = self.store.end(
            task_id, S.CANCELLED, wid_fence=wid, wid=wid, name=name,
            reason=f"interrupted by the worker (signal {signum})", worker=worker,
            expect_refusal=True, ret=metrics.ATTEMPT_FIELDS)
        if res.applied:
            metrics.attempt_ended(
                name, res.values.get("queue"), S.CANCELLED.value, now_ms=res.now_ms,
                started_ms=metrics.started_ms(res.values), enqueued_ms=enqueued_ms)
        return res

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
        publish lease), its payload returned for the publisher. ``version``: publish it as
        this version (the current one) instead of the one it has."""
        fields = {"retries": "0"} if reset_retry_count else {}
        if version is not None:
            fields["ver"] = str(version)
        return self.store.submit(
            task_id, sources=RESUBMITTABLE, lease_ms=self.publish_lease_ms,
            reason=_resubmit_reason(reset_retry_count, version=version),
            fields=fields,
            ret=("msg", "retries", "name", "ver", "dlq"),
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
                  "dlq": "1", "attempt": str(entry.attempt)}
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


def _warn_large_payload(name: str, task_id: str, size: int, limit: int) -> None:
    log.warning(
        "task %s[%s]: its payload (args, kwargs and publish options) is %d bytes as JSON, "
        "above jobbers_payload_warn_bytes=%d; jobbers stores it once (on the task's record "
        "while the task can run, in its dead-letter entry once dead-lettered) and the broker "
        "holds the message: pass a reference to large data (a key, a path, a URL) instead",
        name, task_id, size, limit)


def _encode_payload(payload: dict[str, Any], codec: PayloadCodec | None) -> str:
    try:
        return pl.dumps(pl.seal_arguments(payload, codec))
    except TypeError:
        # Not JSON: keep what a person can read; such a task cannot be republished by jobbers.
        return pl.dumps(pl.seal_arguments(
            {"unserializable": True, "args": repr(payload.get("args")),
             "kwargs": repr(payload.get("kwargs")), "options": {}}, codec))
