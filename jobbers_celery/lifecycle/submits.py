"""Recording a publish: the steps that make a task's record before any worker sees it.

The submit side of the :class:`~jobbers_celery.lifecycle.recorder.Recorder` (which extends
:class:`SubmitRecorder`): what a publishing process records (a publish, a delayed first
publish, a publish that raised) and what a worker records of a message published without a
record. It uses the store's submit step and nothing of the dead-letter side, so a process
that only publishes needs no more of the recorder than this.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from jobbers_celery.core import errortext, intake
from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import HEADER_UNIQUE, HeldElsewhere, duplicate_of, parse_field
from jobbers_celery.core.workflow import HEADER_WORKFLOW
from jobbers_celery.lifecycle import bodyjson
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle.bulk import PublishBatch, member_fair, stamp_published
from jobbers_celery.lifecycle.publisher import internal_publish_ms, publishing_unrecorded
from jobbers_celery.store import StepResult, StepStore, Submission
from jobbers_celery.telemetry import tracing

__all__ = ["ERROR_MESSAGE_MAX_CHARS", "SubmitRecorder", "error_fields", "publishing"]

log = escaped_logger("jobbers.lifecycle")

S = TaskState
_FROM_UNSUBMITTED = (S.UNSUBMITTED,)

#: Characters of an error message the record keeps (a dead letter keeps more, see
#: :mod:`jobbers_celery.core.errortext`): an exception that quotes a big argument must not put
#: another copy of it on the record.
ERROR_MESSAGE_MAX_CHARS = 1024


def error_fields(exc: BaseException | None, message: str | None = None) -> dict[str, str]:
    if exc is None:
        return {"err": pl.dumps({"type": "", "message": _clip(message or "")})}
    type_name, text, _ = pl.describe_exception(exc, message_max=ERROR_MESSAGE_MAX_CHARS)
    return {"err": pl.dumps({"type": type_name, "message": _clip(message) if message else text})}


def _clip(text: str) -> str:
    return errortext.cut_head(text, ERROR_MESSAGE_MAX_CHARS)


#: The records the publish in progress made, with the recorder of each (see
#: :func:`publishing`); ``None`` outside one.
_made: ContextVar[list[tuple[SubmitRecorder, str]] | None] = ContextVar(
    "jobbers_made_records", default=None)


@contextmanager
def publishing() -> Iterator[None]:
    """Around one publish (``app.send_task``, which ``install`` wraps): each ``submitted``
    record it made (:meth:`SubmitRecorder.made`) is ended ``dropped`` at once if the publish
    raises (:meth:`SubmitRecorder.never_sent`), so that no record waits for a message that
    never left.
    Only records it created: a retry's or resubmit's record keeps its publish lease, and a
    scheduler publishes it when the lease expires."""
    made: list[tuple[SubmitRecorder, str]] = []
    token = _made.set(made)
    try:
        yield
    except BaseException as exc:
        for recorder, task_id in made:
            recorder.never_sent(task_id, exc)
        raise
    finally:
        _made.reset(token)


#: A unique task's publish answered ``duplicate`` is asked again after a master check (Redis
#: Sentinel) at most this often per recorder. Each connection checks the master every 0.5 s
#: on its own anyway: under a stream of duplicates this keeps that pace (two sentinel round
#: trips and resubmits a second at most), and a duplicate after a quiet spell is asked again
#: at once, the stale window it would otherwise meet closed.
DUPLICATE_RECHECK_S = 0.5


class SubmitRecorder:
    """Records submissions: the publish side of the store's lifecycle step."""

    def __init__(self, store: StepStore, *, payload_warn_bytes: int = 0,
                 publish_lease_s: float = 30.0, codec: PayloadCodec | None = None,
                 index: Callable[[str, Any, Any], list[str]] | None = None) -> None:
        """``index``: the argument-index digests of a publish (name, args, kwargs; see
        :mod:`jobbers_celery.lifecycle.search`), written by its own submit step."""
        self.store = store
        self.index = index
        self.codec = codec  # seals the arguments of every payload and dead letter it writes
        self.payload_warn_bytes = payload_warn_bytes
        self.publish_lease_ms = int(publish_lease_s * 1000)
        self._rechecked_at = float("-inf")  # the last duplicate asked again (monotonic)

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
        batch: PublishBatch | None = None,
        workflow: Mapping[str, str] | None = None,
    ) -> None:
        """Stamp the message headers and record ``unsubmitted -> submitted`` (one round trip).

        ``jobbers_epoch`` is stamped only when the submission is recorded: a worker that finds
        no record for a message carrying it knows the record was removed on purpose.
        ``batch``: a bulk publish's (see :mod:`jobbers_celery.lifecycle.bulk`), which holds
        the message until it has written this step with the others, then stamps the headers.
        ``workflow``: the canvas fields of the message (:func:`jobbers_celery.core.workflow.
        links`), recorded with the record it makes, which the same step enters in its
        workflow's index; its key is stamped (``jobbers_workflow``) for what it publishes.
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
        if workflow:
            headers.setdefault(HEADER_WORKFLOW, workflow["wf"])
        if version is not None:
            # a resubmit states the version the task failed with; keep it
            headers.setdefault(pl.HEADER_VERSION, version)
        if dead_letter:
            headers[pl.HEADER_DEAD_LETTER] = 1
        if publishing_unrecorded():
            return  # the store is away: the message keeps the headers it was published with
        now = internal_publish_ms()
        if now is None:
            tracing.stamp(headers)  # the trace its republishes continue (see tracing)
            payload = pl.from_publish(headers, body, exchange, routing_key, properties)
            if payload is None:
                log.warning("task %s[%s] uses a message protocol jobbers cannot record", name,
                            task_id)
                return
            create = self._create(name, payload, version, dead_letter, workflow)
            if parse_field(headers.get(HEADER_UNIQUE)) is not None:  # a unique task:
                create["uq"] = str(headers[HEADER_UNIQUE])  # its step takes the lock
            submit = functools.partial(self._submit_published, task_id, name, create,
                                       headers, batch)
            if bodyjson.defer(bodyjson.Pending(task_id, name, body, payload["options"],
                                               self.codec, submit)):
                return  # written as its message reaches jobbers' producer: one encoding
            submit(bodyjson.record_text(payload, self.codec))
            return
        stamp_published(headers, now, self.store.epoch(task_id, max_age=10.0))

    def _submit_published(self, task_id: str, name: str, create: dict[str, str],
                          headers: dict[str, Any], batch: PublishBatch | None,
                          msg: str) -> None:
        """Write a publish's ``submitted`` step with its payload ``msg`` (or hold it in
        ``batch``) and stamp its headers: at the publish signal, or once its message reached
        jobbers' producer (:mod:`jobbers_celery.lifecycle.bodyjson`)."""
        fields = {"msg": msg}
        if headers.get("retries"):  # absent means 0: every byte of a record counts
            fields["retries"] = str(headers["retries"])
        elif len(msg) > self.payload_warn_bytes > 0:  # first publish only
            _warn_large_payload(name, task_id, len(msg), self.payload_warn_bytes)
        if batch is not None:  # the same step, written with the batch's others (a member
            # under fair shares: parked by it when its key has no room)
            batch.add(self, Submission(task_id, name, create, fields, fair=member_fair()),
                      headers)
            return
        result = self._submit(task_id, sources=_FROM_UNSUBMITTED, create=create,
                              fields=fields, reason="published", name=name)
        holder = duplicate_of(result.why)
        if holder is not None:  # another copy holds the unique lock: no message goes
            raise HeldElsewhere(holder)
        if result.applied and result.previous == "missing":
            self.made(task_id)
        # epoch: None if refused (not recorded)
        stamp_published(headers, result.now_ms, result.epoch)

    def _submit(self, task_id: str, **step: Any) -> StepResult:
        """``store.submit`` of a first publish. On Redis Sentinel a ``duplicate`` answer may
        come from a master a failover just demoted (it takes writes until the sentinels
        reconfigure it; a connection checks the master at most every 0.5 s), which still
        sees a holder the new master knows ended: its word would drop this publish. Asked
        once more, each connection of this process checking the master before its next
        command (a refused step wrote nothing); at most every ``DUPLICATE_RECHECK_S``."""
        result = self.store.submit(task_id, **step)
        if (duplicate_of(result.why) is not None and self._may_recheck()
                and self.store.recheck_master()):
            result = self.store.submit(task_id, **step)
        return result

    def _may_recheck(self) -> bool:
        """Whether a duplicate may be asked again now (see ``DUPLICATE_RECHECK_S``)."""
        now = time.monotonic()
        if now - self._rechecked_at < DUPLICATE_RECHECK_S:
            return False
        self._rechecked_at = now
        return True

    def made(self, task_id: str) -> None:
        """Note that the publish in progress (:func:`publishing`) made the ``submitted``
        record of ``task_id``: should the publish raise, :meth:`never_sent` ends it. A
        publish that records many members in one call notes each one it made."""
        made = _made.get()
        if made is not None:
            made.append((self, task_id))

    def never_sent(self, task_id: str, exc: BaseException) -> StepResult | None:
        """``submitted -> dropped`` at once for a record whose publish raised (kombu could
        not encode the message, the broker could not be reached): no message will ever
        start it, and its caller got the exception, so no dead letter. Never raises (the
        publish's own exception is what the caller must see); returns the step, or
        ``None`` if the store could not be reached (the record stays ``submitted`` until
        pruned like any other)."""
        what = errortext.cut_head(f"{type(exc).__name__}: {exc}", 300)
        try:
            return self.store.step(task_id, S.DROPPED, sources=(S.SUBMITTED,),
                                   set_fields=error_fields(exc),
                                   reason=f"never sent: publishing raised {what}")
        except Exception:
            log.warning("the publish of %s raised (%s), and its submitted record could not "
                        "be ended", task_id, what, exc_info=True)
            return None

    def never_released(self, task_id: str, exc: BaseException) -> StepResult | None:
        """``scheduled -> cancelled`` for a bulk publish's member parked under fair shares
        after the member whose publish raised: as in Celery's loop, which stops at the
        raise, it is never published (the release pass skips a cancelled one). Never
        raises; ``None`` if the store could not be reached (it is released later)."""
        what = errortext.cut_head(f"{type(exc).__name__}: {exc}", 300)
        try:
            return self.store.step(task_id, S.CANCELLED, sources=(S.SCHEDULED,),
                                   set_fields=error_fields(exc),
                                   reason=f"never sent: the bulk publish raised {what} "
                                          "before its turn")
        except Exception:
            log.warning("the bulk publish of %s raised (%s), and its parked record could "
                        "not be cancelled: it is released later", task_id, what,
                        exc_info=True)
            return None

    def publish_later(self, task_id: str, name: str, payload: dict[str, Any], *,
                      version: int | None, dead_letter: bool, delay_ms: int,
                      reason: str, workflow: Mapping[str, str] | None = None,
                      fair: FairKey | None = None) -> StepResult:
        """A first publish with a delay (``countdown``/``eta``): ``unsubmitted -> submitted
        -> scheduled`` in one step, with ``payload``, which the scheduler publishes when
        ``run_at`` comes, as for a delayed retry: no ETA message waits at the broker (where
        a Redis broker delivers it again after its visibility timeout). ``fair``: a publish
        under fair shares instead (no delay): parked the same way only when its key has no
        room, else left ``submitted`` for the caller to send (``state`` says which). Raises
        ``TypeError`` if ``payload`` is not JSON. An id or name over the intake limits is not
        recorded (refused: the caller sends an ETA message, which its worker refuses).
        ``workflow``: its canvas fields, as :meth:`publish` records them."""
        too_long = intake.identity_over_limits(task_id, name)
        if too_long:
            log.error("task %s[%s] not recorded: %s", errortext.cut_head(name, 200),
                      errortext.cut_head(task_id, 200), too_long)
            return StepResult(applied=False, previous="missing", now_ms=0, attempt=0,
                              why=too_long)
        msg = self.encode(payload)
        if len(msg) > self.payload_warn_bytes > 0:
            _warn_large_payload(name, task_id, len(msg), self.payload_warn_bytes)
        create = self._create(name, payload, version, dead_letter, workflow)
        uq = (payload["options"].get("headers") or {}).get(HEADER_UNIQUE)
        if parse_field(uq) is not None:  # a unique task: its step takes the lock
            create["uq"] = str(uq)
        return self._submit(task_id, sources=_FROM_UNSUBMITTED, create=create,
                            fields={"msg": msg}, reason="published", name=name,
                            later=(delay_ms, reason) if fair is None else None, fair=fair)

    def _create(self, name: str, payload: Mapping[str, Any], version: int | None,
                dead_letter: bool, workflow: Mapping[str, str] | None) -> dict[str, str]:
        """The fields a first publish's ``submitted`` step creates the record with."""
        create = {"name": name, "queue": pl.queue_of(payload["options"])}
        if dead_letter:
            create["dlq"] = "1"
        if version is not None:
            create["ver"] = str(version)
        if workflow:
            create.update(workflow)
        if self.index is not None:
            self._index(create, name, payload)
        return create

    def _index(self, create: dict[str, str], name: str, payload: Mapping[str, Any]) -> None:
        """Enter the publish's indexed argument values in ``create`` (field ``ix``): its
        submit step indexes them. Never fails the publish: a value it cannot read is not
        indexed (logged)."""
        assert self.index is not None
        try:
            digests = self.index(name, payload.get("args"), payload.get("kwargs"))
        except Exception:
            log.warning("task %s: its arguments could not be indexed", name, exc_info=True)
            return
        if digests:
            create["ix"] = " ".join(digests)

    def encode(self, payload: dict[str, Any]) -> str:
        """``payload`` as the record keeps it: JSON, its arguments sealed when payload keys
        are set. Raises ``TypeError`` if it is not JSON."""
        return pl.dumps(pl.seal_arguments(payload, self.codec))

    def late_submit(self, task_id: str, name: str, version: int, queue: str, dead_letter: bool,
                    msg: str, retries: int,
                    workflow: Mapping[str, str] | None = None,
                    uq: str | None = None) -> StepResult:
        """A worker records the submission of a message published without a record
        (``workflow``: its canvas fields, as :meth:`publish` records them; ``uq``: its
        unique lock, the message's header, which the step takes as the publish would have:
        refused ``duplicate:<holder>`` when another copy holds it)."""
        create = {"name": name, "ver": str(version), "queue": queue,
                  "dlq": "1" if dead_letter else "0", **(workflow or {})}
        if parse_field(uq) is not None:
            create["uq"] = str(uq)
        return self.store.submit(
            task_id, sources=_FROM_UNSUBMITTED,
            create=create,
            fields={"msg": msg, "retries": str(retries)},
            reason="recorded by the worker: no submission record", name=name,
        )


def _warn_large_payload(name: str, task_id: str, size: int, limit: int) -> None:
    log.warning(
        "task %s[%s]: its payload (args, kwargs and publish options) is %d bytes as JSON, "
        "above jobbers_payload_warn_bytes=%d; jobbers stores it once (on the task's record "
        "while the task can run, in its dead-letter entry once dead-lettered) and the broker "
        "holds the message: pass a reference to large data (a key, a path, a URL) instead",
        name, task_id, size, limit)
