"""TaskBase: what every side of :class:`~jobbers_celery.worker.task.JobbersTask` stands on.

The declaration (the task options, read and checked once per class by
``__init_subclass__``) and the plumbing of a running attempt that the driver
(:mod:`~jobbers_celery.worker.task`), the heartbeat (:mod:`~jobbers_celery.worker.taskbeat`)
and the publish side (:mod:`~jobbers_celery.worker.taskpublish`) share: the collaborators,
the running attempt, its outage policy, redaction and the ``failed`` step. Its own module so
that those sides, mixins of JobbersTask, import it rather than each other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore

from jobbers_celery.core.backoff import BackoffStrategy
from jobbers_celery.core.options import (
    OPTION_NAMES,
    DeadLetterPolicy,
    ShutdownPolicy,
    TaskOptions,
    WorkerLostPolicy,
    validate_options,
)
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.ratelimit import RateLimit
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import Unique
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import chords
from jobbers_celery.lifecycle.recorder import Run
from jobbers_celery.store import StepResult
from jobbers_celery.worker import heartbeat as hb
from jobbers_celery.worker import taskrepr
from jobbers_celery.worker.outage import Delivery, Ending
from jobbers_celery.worker.parts import Parts

log = escaped_logger("jobbers.task")
S = TaskState

#: Request attributes jobbers sets on a running task's context (the heartbeat's own are
#: in :mod:`~jobbers_celery.worker.heartbeat`).
ATTEMPT = "jobbers_attempt"
RUN = "jobbers_run"  # the running attempt, a recorder.Run
ENDING = "jobbers_ending"  # its outage policy, an outage.Ending


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


def ends_cancelled(res: StepResult) -> bool:
    """The step ``res`` left the record ``cancelled`` (it applied so, or found it so)."""
    return (res.state is S.CANCELLED) if res.applied else res.previous == S.CANCELLED


def request_id(req: Any) -> str:
    """The id of a tracked task's request (always set: see ``_tracked``)."""
    task_id: str = req.id
    return task_id


class TaskBase(Task):  # type: ignore[type-arg]
    """JobbersTask's declaration and the plumbing its sides share (not a base for users)."""

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
    #: ``max_concurrent`` per key: an argument's name or position, a tuple of them, or
    #: ``f(args, kwargs)`` (see ``core/callkey.py``)
    concurrency_key: str | int | tuple[str | int, ...] | Callable[[Any, Any], Any] | None = None
    max_stall_recoveries: int = 0
    on_worker_lost: WorkerLostPolicy | str | None = None
    unique: Unique | bool | None = None
    rate_limit_by: RateLimit | str | None = None

    jobbers_options: ClassVar[TaskOptions] = TaskOptions()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.jobbers_options = validate_options({n: getattr(cls, n) for n in OPTION_NAMES})
        if cls.jobbers_options.timeout and getattr(cls, "soft_time_limit", None) is None:
            # prefork enforces it by raising SoftTimeLimitExceeded in the task
            cls.soft_time_limit = cls.jobbers_options.timeout  # type: ignore[assignment]

    @property
    def attempt(self) -> int:
        """1 for the first start of this task id, 2 for the next, and so on."""
        return int(getattr(self.request, ATTEMPT, 0) or 0)

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

    def _worker(self) -> str | None:
        return self.request.hostname or None

    def _run(self) -> Run:
        """The running attempt (set by the driver's start)."""
        run: Run = getattr(self.request, RUN)
        return run

    def _delivery(self) -> Delivery:
        req = self.request
        return Delivery(self.name, request_id(req), int(req.retries or 0), self._worker(), req,
                        functools.partial(self.signature_from_request, req), self.run)

    def _ending(self) -> Ending:
        """The outage policy of the steps that end this attempt, run around the recorder's
        call (the recorder only calls down, to the store): held through a store outage, and
        the start recorded again if the store lost it."""
        req = self.request
        ending: Ending | None = getattr(req, ENDING, None)
        if ending is None:
            starter, delivery, opts = self._parts().starter, self._delivery(), self.jobbers_options
            ending = Ending(self.name, delivery.task_id, self.attempt,
                            lambda: starter.step(delivery, opts))
            setattr(req, ENDING, ending)
        return ending

    def _redact(self, exc: BaseException) -> None:
        """Take the secrets out of the message of ``exc`` before Celery logs it and sends it
        in task events, and jobbers records it (see :mod:`jobbers_celery.worker.taskrepr`)."""
        req = self.request
        try:
            redact = self._parts().redactor
        except Exception:  # noqa: BLE001 - not installed: nothing to redact by
            return
        taskrepr.redact_exception(exc, self, req.args, req.kwargs, redact)

    def _pending_checkpoint(self) -> dict[str, str]:
        """What throttled heartbeats left unsent, encoded, to save with the outcome."""
        return hb.pending(self.request, self.name, self.attempt)

    def _fail(self, exc: BaseException, reason: str) -> bool:
        """Record ``failed`` (``cancelled`` if cancellation was pending); returns whether it
        ended cancelled."""
        req = self.request
        setattr(req, hb.DONE, True)
        run, recorder, fields = self._run(), self._parts().recorder, self._pending_checkpoint()
        dead_letter = self.jobbers_options.dead_letter_policy is DeadLetterPolicy.SAVE
        res = self._ending()(lambda: recorder.fail(run, exc, reason=reason, fields=fields,
                                                   dead_letter=dead_letter))
        if not res.applied:
            log.warning("failure of %s[%s] attempt %s not recorded: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
        elif dead_letter and res.state is S.FAILED:
            chords.hold(req)  # a resubmit can still complete its chord (lifecycle.chords)
        return res.applied and res.state is S.CANCELLED
