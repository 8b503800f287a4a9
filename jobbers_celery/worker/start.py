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
from typing import TYPE_CHECKING

from celery.exceptions import Ignore

from jobbers_celery.core.options import DeadLetterPolicy, TaskOptions
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.lifecycle import liveness
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.store import UNREACHABLE, StepResult
from jobbers_celery.worker.outage import HEADER_GIVEN_BACK, Delivery, Handover

if TYPE_CHECKING:
    from jobbers_celery.lifecycle.publisher import Publisher
    from jobbers_celery.lifecycle.recorder import Recorder
    from jobbers_celery.store import TaskStore

__all__ = ["DEFER_RANGE_S", "Starter"]

log = escaped_logger("jobbers.task")
S = TaskState

#: A task over its ``max_concurrent`` cap is deferred by a random delay in this range.
DEFER_RANGE_S = (0.5, 1.5)


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

    def start(self, d: Delivery, opts: TaskOptions) -> StepResult:
        """Record ``started`` (and the submission first, if the message has no record).
        Raises ``UNREACHABLE`` if the store cannot be reached within the wait: then the
        start is not recorded (or not known to be), and the task must not run here."""
        res = self.once(d, opts)
        if not res.applied and res.previous == "missing" and self._record_was_removed(d):
            log.warning("not running %s[%s]: its record was removed (purged, or older than "
                        "jobbers_retention) after it was published", d.name, d.task_id)
            raise Ignore()
        if not res.applied and res.previous in ("missing", S.UNSUBMITTED):
            # Published without a record (Redis was unreachable at publish, or by a client
            # without jobbers): record the submission now rather than lose track of it.
            self._record_late_submit(d, opts)
            res = self.once(d, opts)
        if not res.applied and res.previous in (S.STARTED, S.STALLED) \
                and d.header(HEADER_GIVEN_BACK):
            back = self.handover.take_back(d, res)
            if back is S.UNSUBMITTED:
                self._record_late_submit(d, opts)
                self.publisher.confirm([d.task_id])
            if back is not None:
                res = self.once(d, opts)
        return res

    def once(self, d: Delivery, opts: TaskOptions) -> StepResult:
        try:
            return self.step(d, opts)
        except UNREACHABLE:
            return self._reply_lost(d, opts)

    def step(self, d: Delivery, opts: TaskOptions) -> StepResult:
        """The ``started`` step itself (also what the outage policy sends again when the
        store lost a start, see :class:`~jobbers_celery.worker.outage.Ending`)."""
        hb_ms = round(opts.max_heartbeat_interval * 1000) if opts.max_heartbeat_interval else None
        fields = {}
        if opts.max_stall_recoveries:
            fields["srec"] = str(opts.max_stall_recoveries)
        return self.recorder.start(
            d.task_id, d.name, worker=d.worker, wid=liveness.worker_id(),
            heartbeat_ms=hb_ms, cap=opts.max_concurrent, lease_cap_ms=self.lease_ms,
            defer_ms=round(random.uniform(*DEFER_RANGE_S) * 1000), fields=fields,
        )

    def _reply_lost(self, d: Delivery, opts: TaskOptions) -> StepResult:
        """Redis went away after the ``started`` step was sent: whether it applied is
        unknown. Once Redis answers again (waiting up to ``jobbers_worker_lost_after``), the
        record tells: started by this worker incarnation (it applied), or not (send it again),
        so that the task neither fails on the outage nor starts twice."""
        deadline = time.monotonic() + self.lost_after
        while True:
            try:
                found = self.store.started_by(d.task_id, liveness.worker_id())
                return found if found is not None else self.step(d, opts)
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

    def _record_late_submit(self, d: Delivery, opts: TaskOptions) -> None:
        req = d.request
        sig = d.signature()
        data = pl.from_signature_options(req.args, req.kwargs, dict(sig.options))
        self.recorder.late_submit(
            d.task_id, d.name, opts.version, pl.queue_of(data["options"]),
            opts.dead_letter_policy is DeadLetterPolicy.SAVE, self.recorder.encode(data),
            d.retries)
