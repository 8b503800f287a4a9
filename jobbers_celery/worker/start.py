"""The start of a delivery: one round trip in the common case, and what it takes when the
record is missing, the reply is lost, or the message was given back in a store outage.

:class:`Starter` records ``started`` (and the submission first, for a message published
without a record); the task (:mod:`jobbers_celery.worker.task`) decides what a refused start
means. It is handed what it uses, once, where it is built: the recorder, the store's reads of
a start, the publisher's lease confirmation, the outage :class:`~.outage.Handover`, and
``jobbers_worker_lost_after``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore

from jobbers_celery.core.fairshare import ConcurrencyKeyError, FairKey
from jobbers_celery.core.options import DeadLetterPolicy, TaskOptions
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.ratelimit import RateKey, RateLimitKeyError
from jobbers_celery.core.states import TERMINAL, TaskState
from jobbers_celery.core.unique import HEADER_UNIQUE, duplicate_of
from jobbers_celery.core.workflow import HEADER_WORKFLOW
from jobbers_celery.lifecycle import liveness
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle.publisher import internal_publish_ms
from jobbers_celery.lifecycle.scheduler import call_fair_key, release_and_publish
from jobbers_celery.store import UNREACHABLE, StepResult
from jobbers_celery.worker import bulk
from jobbers_celery.worker.outage import HEADER_GIVEN_BACK, Delivery, Handover

if TYPE_CHECKING:
    from jobbers_celery.lifecycle.publisher import Publisher
    from jobbers_celery.lifecycle.recorder import Recorder
    from jobbers_celery.store import TaskStore

__all__ = ["DEFER_RANGE_S", "KEY_ERRORS", "StartKeys", "Starter", "call_fair_key", "fair_key",
           "fair_publish_key",
           "release_after_end", "start_keys"]

log = escaped_logger("jobbers.task")
S = TaskState

#: A task over its ``max_concurrent`` cap is deferred by a random delay in this range.
DEFER_RANGE_S = (0.5, 1.5)


def rate_key(d: Delivery, opts: TaskOptions) -> RateKey | None:
    """The key a ``rate_limit_by`` task is counted under for this call (``None``: no limit).
    Raises :class:`~jobbers_celery.core.ratelimit.RateLimitKeyError` when its arguments do
    not give one: the task then fails rather than run unlimited."""
    limit = opts.rate_limit_by
    if limit is None:
        return None
    req = d.request
    return RateKey(limit.digest(d.run, req.args or (), req.kwargs or {}), limit.limit)


def fair_key(d: Delivery, opts: TaskOptions) -> FairKey | None:
    """The key a ``concurrency_key`` task's cap counts this call under (``None``: the cap,
    if any, is the name's). Raises :class:`~jobbers_celery.core.fairshare.ConcurrencyKeyError`
    when its arguments do not give one: the task then fails rather than run outside a cap."""
    key = opts.concurrency_key
    if key is None or not opts.max_concurrent:
        return None
    req = d.request
    return FairKey(key.digest(d.run, req.args or (), req.kwargs or {}), opts.max_concurrent)


#: What a refused start may have been told by a master a failover just demoted (Sentinel):
#: the task ended there, or it has no record there (published to the new master).
_STALE_MAY_SAY = frozenset({"missing", *(state.value for state in TERMINAL)})

#: The errors of a call whose arguments give no key for a flow control it needs.
KEY_ERRORS = (RateLimitKeyError, ConcurrencyKeyError)


@dataclass(frozen=True, slots=True)
class StartKeys:
    """The flow-control keys of one call, worked out once per start (a key function may be
    costly). ``error``: its arguments give no key for a control the task declares (an
    argument missing, a key function that raised, a value not JSON or too big). Such a
    call never runs outside its control: its start is recorded without the controls and
    the attempt fails with ``error`` (``started -> failed``, dead-lettered per its policy,
    resubmittable once the code or the arguments give a key), as a call with wrong
    arguments fails."""

    rate: RateKey | None = None
    fair: FairKey | None = None
    error: RateLimitKeyError | ConcurrencyKeyError | None = None


def start_keys(d: Delivery, opts: TaskOptions) -> StartKeys:
    """Each key worked out on its own: a call that gives its concurrency key but not its
    rate-limit key still counts under its fair share (its publish counted it there, and
    its end releases it) while it starts only to fail."""
    error: RateLimitKeyError | ConcurrencyKeyError | None = None
    try:
        rate = rate_key(d, opts)
    except RateLimitKeyError as exc:
        rate, error = None, exc
    try:
        fair = fair_key(d, opts)
    except ConcurrencyKeyError as exc:
        fair, error = None, error or exc
    return StartKeys(rate, fair, error)


class Starter:
    """Records the start of a delivery (see the module)."""

    def __init__(self, store: TaskStore, recorder: Recorder, publisher: Publisher,
                 handover: Handover, lost_after: float) -> None:
        self.store = store
        self.recorder = recorder
        self.publisher = publisher
        self.handover = handover
        self.lost_after = lost_after
        self.lease_ms = int(lost_after * 1000)

    def start(self, d: Delivery, opts: TaskOptions, keys: StartKeys | None = None
              ) -> StepResult:
        """Record ``started`` (and the submission first, if the message has no record).
        Raises ``UNREACHABLE`` if the store cannot be reached within the wait: then the
        start is not recorded (or not known to be), and the task must not run here.
        ``keys``: the call's flow-control keys (:func:`start_keys`, worked out here if not
        given)."""
        keys = start_keys(d, opts) if keys is None else keys
        res = self.once(d, opts, keys)
        if not res.applied and res.previous in _STALE_MAY_SAY and self.store.recheck_master():
            # Refused as ended or unknown, so this delivery would be dropped or recorded
            # late: on Redis Sentinel the answer may have come from a master a failover just
            # demoted (it takes writes until the sentinels reconfigure it), whose word would
            # strand the record the new master holds as waiting. Asked once more, after
            # every connection of this process checked the master.
            refused, res = res, self.once(d, opts, keys)
            if res.applied:
                log.info("%s[%s]: its start, refused as %s, applied once the master was "
                         "checked again (a failover)", d.name, d.task_id, refused.previous)
        if not res.applied and res.previous == "missing" and self._record_was_removed(d):
            log.warning("not running %s[%s]: its record was removed (purged, or older than "
                        "jobbers_retention) after it was published", d.name, d.task_id)
            raise Ignore()
        if not res.applied and res.previous in ("missing", S.UNSUBMITTED):
            # Published without a record (Redis was unreachable at publish, or by a client
            # without jobbers): record the submission now rather than lose track of it.
            self._record_late_submit(d, opts, made=res.previous == "missing")
            res = self.once(d, opts, keys)
        if not res.applied and res.previous in (S.STARTED, S.STALLED) \
                and d.header(HEADER_GIVEN_BACK):
            back = self.handover.take_back(d, res)
            if back is S.UNSUBMITTED:
                self._record_late_submit(d, opts, made=False)
                self.publisher.confirm([d.task_id])
            if back is not None:
                res = self.once(d, opts, keys)
        return res

    def once(self, d: Delivery, opts: TaskOptions, keys: StartKeys) -> StepResult:
        try:
            return self._step(d, opts, keys)
        except UNREACHABLE:
            return self._reply_lost(d, opts, keys)

    def step(self, d: Delivery, opts: TaskOptions) -> StepResult:
        """The ``started`` step itself (also what the outage policy sends again when the
        store lost a start, see :class:`~jobbers_celery.worker.outage.Ending`)."""
        return self._step(d, opts, start_keys(d, opts))

    def _step(self, d: Delivery, opts: TaskOptions, keys: StartKeys) -> StepResult:
        hb_ms = round(opts.max_heartbeat_interval * 1000) if opts.max_heartbeat_interval else None
        fields = {}
        if opts.max_stall_recoveries:
            fields["srec"] = str(opts.max_stall_recoveries)
        return self.recorder.start(
            d.task_id, d.name, worker=d.worker, wid=liveness.worker_id(),
            heartbeat_ms=hb_ms,
            # a call without its concurrency key only fails: outside any cap
            cap=None if opts.concurrency_key is not None and keys.fair is None
            else opts.max_concurrent,
            lease_cap_ms=self.lease_ms,
            defer_ms=round(random.uniform(*DEFER_RANGE_S) * 1000), fields=fields,
            rate=keys.rate,
            fair=keys.fair,
        )

    def _reply_lost(self, d: Delivery, opts: TaskOptions, keys: StartKeys) -> StepResult:
        """Redis went away after the ``started`` step was sent: whether it applied is
        unknown. Once Redis answers again (waiting up to ``jobbers_worker_lost_after``), the
        record tells: started by this worker incarnation (it applied), or not (send it again),
        so that the task neither fails on the outage nor starts twice."""
        deadline = time.monotonic() + self.lost_after
        while True:
            try:
                found = self.store.started_by(d.task_id, liveness.worker_id())
                return found if found is not None else self._step(d, opts, keys)
            except UNREACHABLE:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _record_was_removed(self, d: Delivery) -> bool:
        """Was this message's submission recorded in the current dataset? Then a missing
        record was removed on purpose and the message must not run. Otherwise (published
        while Redis was unreachable, by a client without jobbers, or before the dataset was
        lost) the worker records it late and runs it."""
        epoch = d.header(pl.HEADER_EPOCH)
        return bool(epoch) and epoch == self.store.epoch(d.task_id)

    def _record_late_submit(self, d: Delivery, opts: TaskOptions, *, made: bool) -> None:
        """Record the submission of a message published without a record (``made``: the
        record is made now; else it exists, ``unsubmitted``). A unique copy whose record is
        made now takes its lock then, as its publish would have (a record that exists had
        its lock taken when it was made, on every layout), and one whose key another copy
        holds does not run: ``Ignore``, its result REVOKED naming the holder, as a
        duplicate member of a canvas is (a chord's part counted, the rest of its chain
        REVOKED: :func:`~jobbers_celery.worker.bulk.revoke_duplicate`)."""
        req = d.request
        sig = d.signature()
        data = pl.from_signature_options(req.args, req.kwargs, dict(sig.options))
        canvas = pl.workflow_of(  # its canvas, as its publish would have recorded it
            sig.app, {"id": d.task_id, "root_id": req.root_id, "parent_id": req.parent_id,
                      "group": req.group, HEADER_WORKFLOW: d.header(HEADER_WORKFLOW)},
            (req.args, req.kwargs, {"chain": req.chain, "callbacks": req.callbacks,
                                    "chord": req.chord}))
        res = self.recorder.late_submit(
            d.task_id, d.name, opts.version, pl.queue_of(data["options"]),
            opts.dead_letter_policy is DeadLetterPolicy.SAVE, self.recorder.encode(data),
            d.retries, workflow=canvas, uq=d.header(HEADER_UNIQUE) if made else None)
        holder = duplicate_of(res.why)
        if holder is not None:
            log.warning("not running %s[%s]: published while the store could not be reached, "
                        "and a copy with the same unique key holds it (%s)", d.name, d.task_id,
                        holder)
            bulk.revoke_duplicate(sig.app, d.task_id, d.name, holder, chord=req.chord,
                                  group_id=req.group,
                                  group_index=getattr(req, "group_index", None),
                                  chain=req.chain)
            raise Ignore()


def fair_publish_key(task: Any, args: Any, kwargs: Any, options: dict[str, Any]
                     ) -> FairKey | None:
    """The key of a publish of a ``concurrency_key`` task, which its publish parks when
    the key has no room: a first publish, a chain's link (``chain`` in its options: the
    first by the client, each next one by the worker as the link before it ends; the
    chain's remaining links, and the group and chord of a chain's last link in a group
    or a chord's header, go with it in its record), a running task's request published
    again (its options, ``retries`` and ``chain`` among them: an immediate retry,
    published once its attempt ended, or a resubmit at the worker's shutdown), of any
    task, a canvas member's too (its record holds its group, chord and chain, as a
    delayed retry's does). ``None``:
    none, or a publish that goes out as Celery's: a group's or a chord header's member
    (its group's bulk publish parks it, see
    :func:`~jobbers_celery.worker.taskpublish.fair_member_key`), a republish, a key its
    arguments do not give (its start then refuses it)."""
    if internal_publish_ms() is not None:
        return None  # a republish: its submission is recorded already
    if not options.get("retries") and "chain" not in options \
            and (options.get("chord") or options.get("group_id") or options.get("producer")):
        return None  # a group's or a chord header's member: the group's bulk publish's
    return call_fair_key(task, args, kwargs)


def release_after_end(task: Any, run: Any) -> None:
    """After an attempt of a ``concurrency_key`` task that started here (``run``) ended:
    publish its key's next parked task now, if its key has room (one store call when
    none is parked), rather than at the next scheduler pass."""
    key = None if run is None else call_fair_key(task, task.request.args,
                                                   task.request.kwargs)
    if key is None:
        return
    jobbers = task._parts().jobbers
    release_and_publish(jobbers.store, jobbers.publisher, [(task.name, key.digest)],
                        int(jobbers.config.publish_lease * 1000), getattr(run, "worker", None))
