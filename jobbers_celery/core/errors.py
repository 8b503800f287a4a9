"""Exceptions raised by jobbers. Pure: imports nothing outside the standard library."""

from __future__ import annotations

__all__ = [
    "AttemptSuperseded",
    "CheckpointTooLarge",
    "ConfigurationError",
    "DeadLetterRefused",
    "InvalidTaskOption",
    "InvalidTransition",
    "JobbersError",
    "ResubmitRunConflict",
    "StoreUnavailable",
    "TaskCancelled",
    "TaskTimeout",
]


class JobbersError(Exception):
    """Base class of every jobbers error."""


class ConfigurationError(JobbersError):
    """A ``jobbers_*`` setting is missing or wrong; raised by ``install()``."""


class InvalidTaskOption(JobbersError, ValueError):
    """A task was declared with a bad option; raised when the task is declared."""


class InvalidTransition(JobbersError):
    """A state change that the lifecycle table does not allow."""

    def __init__(self, current: str, target: str) -> None:
        super().__init__(f"transition {current} -> {target} is not allowed")
        self.current = current
        self.target = target


class StoreUnavailable(JobbersError):
    """Redis, the jobbers store, did not serve a call of :class:`~jobbers_celery.Jobbers`:
    it cannot be reached, timed out, refused the call (writes refused, an ACL) or failed it.

    Raised by every ``Jobbers`` method that reads or changes the store (``get``, ``history``,
    ``tasks``, ``scheduled``, ``counts``, ``now``, ``resubmit``, ``resubmit_dead_letters``,
    ``cancel``, ``clean``, ``cleaner_status``, ``purge``). The instance is also the
    redis-py (or ``OSError``) exception it stands for, with the same class name, message and
    attributes, so ``except redis.ConnectionError`` written before it existed still catches
    it; new code catches this class and needs no redis-py import.
    """


class TaskCancelled(BaseException):  # named by the public API contract
    """Raised inside a running task whose cancellation was requested.

    A ``BaseException`` so that ``except Exception`` in task code and Celery's
    ``autoretry_for=(Exception,)`` do not swallow it.
    """


class AttemptSuperseded(TaskCancelled):
    """Raised by ``heartbeat()`` in an attempt the cleaner declared stalled.

    The task has been recovered (or dead-lettered) without this attempt: whatever it does
    from now on would be rejected, so it should stop. A subclass of :class:`TaskCancelled`
    so that cleanup written for cancellation runs here too.
    """


class TaskTimeout(JobbersError):
    """The task ran longer than its ``timeout`` option; treated as an expected exception."""


class CheckpointTooLarge(JobbersError, ValueError):
    """A checkpoint or progress value exceeds the size limit once encoded as JSON."""


class DeadLetterRefused(JobbersError):
    """A dead-letter sink cannot store this entry, for a reason of the entry's own (a value
    its store refuses), not because the store is down: the dispatcher tries the entry's
    storable form, then sets it aside, and writes the entries behind it. A sink raises it
    (``raise DeadLetterRefused(...) from exc``) for an error it knows is about the entry."""


class ResubmitRunConflict(JobbersError):
    """A paced resubmit is not in a status the request applies to (e.g. resuming a
    cancelled run); ``status`` is the one it is in."""

    def __init__(self, run_id: int, action: str, status: str) -> None:
        self.run_id, self.action, self.status = run_id, action, status
        sources = {"pause": "queued or running", "resume": "paused",
                   "cancel": "queued, running or paused", "continue": "halted"}.get(action, "?")
        done = {"pause": "paused", "resume": "resumed", "cancel": "cancelled",
                "continue": "continued"}.get(action, action)
        super().__init__(f"paced resubmit {run_id} is {status}: it can be {done} only "
                         f"when {sources}")
