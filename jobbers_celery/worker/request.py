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
from typing import TYPE_CHECKING, Any

from billiard.einfo import ExceptionInfo
from celery.exceptions import InvalidTaskError
from celery.platforms import signals as celery_signals
from celery.worker.request import Request
from celery.worker.state import task_ready

from jobbers_celery.core import errortext, intake
from jobbers_celery.core.options import DeadLetterPolicy
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.redaction import redactor
from jobbers_celery.core.states import TERMINAL
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle.liveness import HALTED
from jobbers_celery.lifecycle.payload import HEADER_ENQUEUED_AT, HEADER_VERSION
from jobbers_celery.telemetry import metrics
from jobbers_celery.worker import taskrepr
from jobbers_celery.worker.task import Revoked

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
            jobbers = Jobbers.find(app)
            redact = taskrepr.redactor_of(jobbers.config) if jobbers else redactor()
            shown = taskrepr.worker_reprs(app, self.task, self.args, self.kwargs, redact)
        except Exception:  # odd arguments: nothing of them rather than the header's text
            log.debug("could not redact the arguments of %s[%s]", self.name, self.id,
                      exc_info=True)
            shown = (NOT_SHOWN, NOT_SHOWN)
        self._argsrepr, self._kwargsrepr = shown
        self.request_dict["argsrepr"], self.request_dict["kwargsrepr"] = shown

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
        except NotImplementedError:
            log.warning("%s[%s] cannot be interrupted on this pool; its cancellation is "
                        "recorded: it ends cancelled at its next heartbeat()",
                        self.task.name, self.id)
            raise

    def on_failure(self, exc_info: ExceptionInfo, send_failed_event: bool = True,
                   return_ok: bool = False) -> Any:
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
        return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                  return_ok=return_ok)

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
        return bool(super().revoked())

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
        self.task.backend.mark_as_failure(self.id, exc, request=self._context,  # type: ignore[attr-defined]
                                          store_result=self.store_errors)
        self.reject(requeue=False)
