"""JobbersRequest: a task's request in the worker's main process.

- A message over the intake limits (:mod:`jobbers_celery.core.intake`: arguments or headers
  nested too deep or too many, an over-long task id, name or ``jobbers_*`` header) is refused
  as an invalid task message (:class:`OverLimits`) before anything walks or pickles it, so
  the worker lives on; it ends ``dropped`` with the reason (:mod:`jobbers_celery.worker.refusals`).
- A message whose ``jobbers_version`` header differs from the worker's registered version is
  dropped here (recorded, dead-lettered when the task saves dead letters, rejected without
  requeue) so it never occupies a pool slot. A malformed message is refused as an invalid
  task message (see :mod:`jobbers_celery.worker.refusals`) instead of stopping the worker.
- Celery's revoke with ``terminate`` (``app.control.revoke(id, terminate=True)``, ``celery
  control terminate SIGTERM <id>``, Flower's terminate) calls :meth:`terminate`:
  the task's cancellation is recorded first, with the revoke as its reason, then the signal
  goes to the pool child, whose task ends ``cancelled`` (not its ``on_shutdown`` policy, no
  dead letter). A pool that cannot interrupt (threads) leaves the task running: it ends
  ``cancelled`` at its next ``heartbeat()``. (A solo worker reads the command only between
  tasks.) The worker's own shutdown interrupts tasks without this method
  (``shutdown.interrupt``), so its policies still apply.
- A task whose delivery ended ``cancelled`` in the record raises
  :class:`~jobbers_celery.worker.task.Revoked`; :meth:`on_failure` tells Celery as its own revoke
  does (REVOKED in the result backend, a ``task-revoked`` event, ``task_revoked``).
- Its ``argsrepr``/``kwargsrepr`` are made from the decoded body, redacted (never the
  message's headers), and its ``info()`` (``celery inspect``) shows them, not the arguments.
- A request whose stalled attempt the worker ended (see :mod:`jobbers_celery.lifecycle.liveness`) ends
  quietly, its message acknowledged.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from billiard.einfo import ExceptionInfo
from celery.exceptions import InvalidTaskError, Reject, TimeLimitExceeded, WorkerLostError
from celery.platforms import signals as celery_signals
from celery.utils.saferepr import saferepr as safe_repr
from celery.worker.request import Request
from celery.worker.state import task_ready

from jobbers_celery.core import errortext, intake
from jobbers_celery.core.options import DeadLetterPolicy, WorkerLostPolicy
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.redaction import Redactor, redactor
from jobbers_celery.core.states import TERMINAL
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import chords, liveness
from jobbers_celery.lifecycle.liveness import HALTED
from jobbers_celery.lifecycle.payload import HEADER_ENQUEUED_AT, HEADER_VERSION
from jobbers_celery.telemetry import metrics
from jobbers_celery.worker import shutdown, taskrepr
from jobbers_celery.worker.pause import hold_if_paused
from jobbers_celery.worker.task import DROP_ON_COMPLETION, JobbersTask, Revoked

if TYPE_CHECKING:
    from celery.worker.request import _InfoDict

    from jobbers_celery.lifecycle.recorder import Recorder

__all__ = ["JobbersRequest", "OverLimits", "VersionMismatch"]

log = escaped_logger("jobbers.request")


class VersionMismatch(Exception):
    """The message was published for another version of the task than this worker runs."""


class OverLimits(InvalidTaskError):
    """The message is over the worker's intake limits (:mod:`jobbers_celery.core.intake`): Celery
    refuses it as an invalid task message (acknowledged, never run) and jobbers ends it
    ``dropped`` with the reason (:mod:`jobbers_celery.worker.refusals`)."""


#: Set on a request's context when jobbers already recorded the outcome Celery announces
#: (read by the ``task_revoked`` handler: nothing to record then).
RECORDED = "jobbers_outcome_recorded"
#: What the worker shows of arguments it could not redact.
NOT_SHOWN = "[arguments not shown]"


def revoke_reason(signum: Any) -> str:
    """The history reason of a revoke with ``terminate`` and signal ``signum``."""
    try:
        name = signals.Signals(celery_signals.signum(signum or "TERM")).name
    except (ValueError, TypeError, AttributeError):
        name = str(signum)
    return f"revoked with terminate ({name})"


def _rerun_on_worker_lost(task: JobbersTask) -> bool:
    """Whether the message of ``task``, whose worker process was lost, goes back to the
    broker to run again (``on_worker_lost``, by default Celery's ``reject_on_worker_lost``);
    only an ``acks_late`` message can (Celery's rule: the others were acknowledged)."""
    policy = task.jobbers_options.on_worker_lost
    if policy is None:
        return bool(task.reject_on_worker_lost)
    return policy is WorkerLostPolicy.RERUN


@contextmanager
def _reject_on_worker_lost(task: JobbersTask, value: bool) -> Iterator[None]:
    """``task.reject_on_worker_lost`` reads ``value`` inside the block (an instance
    attribute over the class's, taken away after it)."""
    missing = object()
    had = task.__dict__.get("reject_on_worker_lost", missing)
    task.reject_on_worker_lost = value
    try:
        yield
    finally:
        if had is missing:
            del task.reject_on_worker_lost
        else:
            task.reject_on_worker_lost = had


#: The free texts of Celery's task events that a task's outcome fills, by event type.
_EVENT_TEXTS = {"task-succeeded": ("result",), "task-failed": ("exception", "traceback"),
                "task-retried": ("exception", "traceback")}


class JobbersRequest(Request):
    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        # Celery's consumer catches only InvalidTaskError from a request it builds: any other
        # error of a malformed message (a body that is not [args, kwargs, embed], a missing
        # header) stops the worker ("Unrecoverable error"), and the message, given back to
        # the broker, stops the next worker too. Refuse it as invalid: rejected, recorded.
        try:
            super().__init__(message, *args, **kwargs)
        except InvalidTaskError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidTaskError(
                f"malformed task message: {type(exc).__name__}: {exc}") from exc
        # before anything walks the arguments (and before the pool pickles them: nested
        # ~500 deep, that kills the worker's main process)
        why = intake.message_over_limits(self.id, self.name, self.request_dict, self.body)
        if why:
            raise OverLimits(why)
        self._redact_reprs()

    def _redact_reprs(self) -> None:
        """What the worker shows of the arguments, made from the decoded body with the
        redactor: never the message's own ``argsrepr``/``kwargsrepr`` (a publisher without
        jobbers, or protocol 1, leaves real values there; see :mod:`jobbers_celery.worker.taskrepr`)."""
        try:
            app = self.app or self.task.app
            shown = taskrepr.worker_reprs(app, self.task, self.args, self.kwargs,
                                          self._redactor())
        except Exception:  # odd arguments: nothing of them rather than the header's text
            log.debug("could not redact the arguments of %s[%s]", self.name, self.id,
                      exc_info=True)
            shown = (NOT_SHOWN, NOT_SHOWN)
        self._argsrepr, self._kwargsrepr = shown
        self.request_dict["argsrepr"], self.request_dict["kwargsrepr"] = shown

    def send_event(self, type: str, **fields: Any) -> None:
        """Celery's task events, with the texts a task's outcome gives redacted as its log
        lines are: ``task-succeeded``'s ``result`` is the repr of the return value (Flower
        shows it: a task returning what it was given showed its secret there), and a failure's
        ``exception`` and ``traceback`` texts."""
        eventer = getattr(self, "_eventer", None)  # Celery's, set in its __init__
        if eventer is not None and eventer.enabled and self.task.send_events:
            texts = [k for k in _EVENT_TEXTS.get(type, ()) if isinstance(fields.get(k), str)]
            if texts:
                red = self._redactor()
                for key in texts:
                    fields[key] = red.text(fields[key])
        super().send_event(type, **fields)

    def _redactor(self) -> Redactor:
        jobbers = Jobbers.find(self.app or self.task.app)
        return taskrepr.redactor_of(jobbers.config) if jobbers else redactor()

    def info(self, safe: bool = False) -> _InfoDict:
        """What ``celery inspect active/reserved/scheduled/query_task`` (so Flower's worker
        page) show of the task: always the redacted reprs the worker made, never the
        arguments themselves."""
        return super().info(safe=True)

    def _recorder(self) -> Recorder:
        """The recorder of its app's jobbers (raises when jobbers is not installed)."""
        return Jobbers.of(self.task.app).recorder

    def terminate(self, pool: Any, signal: Any = None) -> None:
        """Celery's revoke with ``terminate``: record the cancellation before the signal.

        Called in the worker's main process by the ``revoke``/``terminate`` control command
        (and again when a request not yet accepted by the pool is, then it runs here). The
        cancellation is recorded first, so that the task, interrupted, ends ``cancelled``
        with the revoke as its reason instead of applying its ``on_shutdown`` policy. If it
        cannot be recorded (the store is away) the signal still goes out, as in Celery.
        """
        if self.time_start and not self._already_revoked:
            reason = revoke_reason(signal)
            try:
                done = self._recorder().revoke_running(self.id, reason=reason)
                log.info("terminating %s[%s] (%s): its cancellation is %s (it was %s)",
                         self.task.name, self.id, reason, done.outcome, done.previous)
            except Exception:
                log.exception("could not record the revoke of %s[%s]; its on_shutdown "
                              "policy applies", self.task.name, self.id)
        try:
            super().terminate(pool, signal)
            if self.time_start and self.worker_pid:
                shutdown.signalled(self, pool)
        except NotImplementedError:
            log.warning("%s[%s] cannot be interrupted on this pool; its cancellation is "
                        "recorded: it ends cancelled at its next heartbeat()",
                        self.task.name, self.id)
            raise

    def on_failure(self, exc_info: ExceptionInfo, send_failed_event: bool = True,
                   return_ok: bool = False) -> Any:
        with liveness.ending(self.id):  # Celery's task_ready comes before the record
            return self._on_failure(exc_info, send_failed_event, return_ok)

    def _on_failure(self, exc_info: ExceptionInfo, send_failed_event: bool,
                    return_ok: bool) -> Any:
        shutdown.lives_on(self)  # if the process it ran in answered, it lives on
        if getattr(self, HALTED, False):
            # its worker ended this stalled attempt (liveness): recorded, and replaced by
            # the recovery; Celery would leave a terminated task's message unacknowledged
            # (on RabbitMQ, holding a prefetch slot until the connection closes)
            self._announce_halt()
            task_ready(self)
            return self.acknowledge()
        # billiard wraps it (ExceptionWithTraceback, whose .exc it is) unless the pool is
        # in this process
        exc = getattr(exc_info.exception, "exc", exc_info.exception)
        if isinstance(exc, Revoked) and not self._already_revoked:
            self._announce_jobbers_cancel(exc.reason)
            return None
        if self._worker_lost(exc) or isinstance(exc, TimeLimitExceeded) or (
                isinstance(exc, Reject) and not getattr(exc, "requeue", False)):
            self._hold_chord_part()  # failed for good into the DLQ, if it saves dead letters
        task = self.task
        self._jobbers_failure = exc  # read by reject(): a requeue is recorded first
        if isinstance(task, JobbersTask) and self._worker_lost(exc):
            rerun = _rerun_on_worker_lost(task)
            if rerun != bool(task.reject_on_worker_lost):
                # the task's on_worker_lost differs from Celery's setting, which Celery
                # reads from the task: this request's handling alone (the main process
                # handles one failure at a time) sees the task's choice
                with _reject_on_worker_lost(task, rerun):
                    return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                              return_ok=return_ok)
        return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                  return_ok=return_ok)

    def _retry_worker_lost(self, exc: BaseException, exc_info: Any) -> bool:
        """Celery 5.7's ``retry_on_worker_lost``: the lost attempt is recorded ended first
        (``started -> unsubmitted``), so that the retry Celery publishes next is recorded
        and runs as the next attempt, instead of being refused as a duplicate."""
        if isinstance(self.task, JobbersTask):
            try:
                self._recorder().retry_reported(self.id, self.task.name,
                                                wid=liveness.worker_id(), exc=exc)
            except Exception:
                log.exception("could not record the retry of %s[%s] after its worker "
                              "process was lost", self.task.name, self.id)
        retried: bool = super()._retry_worker_lost(exc, exc_info)  # type: ignore[misc]
        return retried

    def _worker_lost(self, exc: BaseException | None) -> bool:
        """Celery handles ``exc`` as a lost worker process (``WorkerLostError``, or the
        exit billiard reports before the process is gone), as ``Request.on_failure`` does."""
        if isinstance(exc, WorkerLostError):
            return True
        return isinstance(exc, SystemExit | KeyboardInterrupt) and not (
            getattr(self, "_already_cancelled", False) or self._already_revoked)

    def reject(self, requeue: bool = False) -> None:
        """Celery hands a failed task's message back to the broker (``requeue``): the
        record says so first, so that the redelivered copy starts as the next attempt
        (``submitted -> started``) instead of finding its record ``started`` or
        ``unsubmitted``. After a lost worker process (``reject_on_worker_lost``, or
        ``on_worker_lost="rerun"``): ``started -> unsubmitted -> submitted``. After
        ``Reject(requeue=True)``, which the task recorded ``started -> unsubmitted``:
        ``unsubmitted -> submitted``. (A hard time limit with ``acks_on_timeout=False`` is
        recorded ``failed`` by ``task_failure`` before Celery requeues it.)"""
        failure = getattr(self, "_jobbers_failure", None)
        if requeue and failure is not None and not self.acknowledged \
                and isinstance(self.task, JobbersTask):
            try:
                recorder = self._recorder()
                if isinstance(failure, Reject):
                    recorder.requeued(self.id, self.task.name)
                elif self._worker_lost(failure):
                    recorder.requeue_reported(self.id, self.task.name,
                                              wid=liveness.worker_id(), exc=failure,
                                              why="its worker process was lost")
            except Exception:
                log.exception("could not record the requeue of %s[%s]", self.task.name,
                              self.id)
        super().reject(requeue=requeue)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if not soft:
            self._hold_chord_part()
        super().on_timeout(soft, timeout)

    def _hold_chord_part(self) -> None:
        """A failure this process reports to Celery (a lost pool process, a hard time limit,
        ``Reject(requeue=False)``, a version dropped here) goes to the dead-letter queue when
        the task saves dead letters: its chord part is held, so a resubmit can still
        complete the chord (:mod:`jobbers_celery.lifecycle.chords`). A message Celery
        requeues instead is not marked failed: holding changes nothing."""
        opts = getattr(self.task, "jobbers_options", None)
        if opts is not None and opts.dead_letter_policy is DeadLetterPolicy.SAVE:
            chords.hold(self._context)  # type: ignore[attr-defined]

    def _success_was_stored(self) -> Any:
        """Celery 5.7 asks, for a lost pool process, whether the task's SUCCESS was stored
        before the loss (then it stores no FAILURE and requeues nothing). When it was, the
        record is ended ``completed`` too: a task whose result is not folded into the
        ``completed`` step records its completion just after Celery's write, and a process
        killed between the two left it ``started``."""
        meta = super()._success_was_stored()  # type: ignore[misc]
        if meta and isinstance(self.task, JobbersTask):
            try:
                self._recorder().complete_reported(self.id, self.task.name,
                                                   wid=liveness.worker_id(),
                                                   drop=DROP_ON_COMPLETION)
            except Exception:
                log.exception("could not record the completion of %s[%s], whose result was "
                              "stored before its worker process was lost", self.task.name,
                              self.id)
        return meta

    def _announce_halt(self) -> None:
        """A task event for the stalled attempt its worker ended, so that Flower and other
        event readers do not show it started for ever: ``task-retried`` when the cleaner
        recovered it (the next attempt's events follow; Celery's event state lets a retry
        be followed by a start), ``task-failed`` when the stall was its end."""
        if not (self.eventer and self.eventer.enabled and self.task.send_events):
            return
        try:
            record = Jobbers.of(self.task.app).get(self.id)
        except Exception:  # the store is out: say what is known for sure
            log.warning("could not read %s[%s] to announce its stalled attempt", self.task.name,
                        self.id, exc_info=True)
            record = None
        final = record is None or record.state in TERMINAL
        self.send_event("task-failed" if final else "task-retried", traceback="",
                        exception="stalled: the cleaner declared this attempt stalled and "
                                  "its worker ended it")

    def _announce_jobbers_cancel(self, reason: str) -> None:
        """Celery's own announcement of a revoked request (backend REVOKED, ``task-revoked``
        event, ack, ``task_revoked``) for one jobbers has recorded ``cancelled``."""
        setattr(self._context, RECORDED, True)  # type: ignore[attr-defined]
        try:
            self._announce_revoked(reason, False, None, False)  # type: ignore[attr-defined]
        except Exception:
            log.exception("could not tell Celery that %s[%s] is cancelled", self.task.name,
                          self.id)
            self.acknowledge()

    def revoked(self) -> bool:
        if self._already_revoked:
            return True
        got = self.request_dict.get(HEADER_VERSION)
        want = getattr(self.task, "version", None)
        if got is not None and want is not None and got != want:
            self._drop_version_mismatch(got, want)
            return True
        if super().revoked():
            return True
        return hold_if_paused(self)  # a paused task name holds it, a paused queue keeps it

    def _drop_version_mismatch(self, got: Any, want: Any) -> None:
        shown = errortext.cut_head(str(got), 64)  # a header: any value its publisher chose
        message = f"message version {shown} differs from worker version {want}"
        log.warning("dropping %s[%s]: %s", self.task.name, self.id, message)
        exc = VersionMismatch(message)
        try:
            recorder = self._recorder()
            policy = getattr(self.task, "jobbers_options", None)
            recorder.drop(
                self.id, self.task.name, reason=message, worker=self.hostname, exc=exc,
                enqueued_ms=metrics.ms_value(self.request_dict.get(HEADER_ENQUEUED_AT)),
                dead_letter=policy is not None
                and policy.dead_letter_policy is DeadLetterPolicy.SAVE)
        except Exception:
            log.exception("could not record the drop of %s[%s]", self.task.name, self.id)
        self._already_revoked = True
        task_ready(self)
        self._hold_chord_part()
        self.task.backend.mark_as_failure(self.id, exc, request=self._context,  # type: ignore[attr-defined]
                                          store_result=self.store_errors)
        self._announce_drop(exc)
        self.reject(requeue=False)

    def _announce_drop(self, exc: BaseException) -> None:
        """A ``task-failed`` event for a task dropped before it ran, so that Flower and other
        readers of Celery's events end it: the ``task-rejected`` the reject sends ranks below
        ``RECEIVED`` in ``celery.events.state`` (``states.PRECEDENCE``), and the task would
        show received for ever. FAILURE is what the result backend says too."""
        if not (self.eventer and self.eventer.enabled and self.task.send_events):
            return
        try:
            self.send_event("task-failed", exception=safe_repr(exc), traceback="")
        except Exception:  # an event is a courtesy: the drop itself is done
            log.warning("could not announce the drop of %s[%s]", self.task.name, self.id,
                        exc_info=True)
