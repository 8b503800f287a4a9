"""Plain values the store returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobbers_celery.states import TaskState

__all__ = ["Claimed", "Heartbeat", "ResultWrite", "StepResult"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outcome of one lifecycle step.

    ``previous`` is the state before the step (``"missing"`` when there was no record);
    ``attempt`` is the attempt after it; ``state`` the state it ended in when applied (not
    always the target asked for: a pending cancellation or a concurrency cap redirects it);
    ``why`` says why a refused step was refused (``state``, ``missing``, ``stale_attempt``
    or ``other_worker``).
    """

    applied: bool
    previous: str
    now_ms: int
    attempt: int
    state: TaskState | None = None
    values: dict[str, str] = field(default_factory=dict)
    why: str | None = None
    #: the dataset's epoch id, returned by an applied step that may create the record
    epoch: str | None = None
    #: with ``write_result``: whether the script wrote Celery's result (``False``: the step
    #: was refused, or the result's db could not be selected; Celery must write it)
    result_written: bool = False


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task the scheduler claimed and must publish. ``run_at`` is set when it was claimed
    because its ``run_at`` came (not when a lapsed publish lease is taken over)."""

    task_id: str
    msg: str
    retries: int
    name: str
    run_at: int | None = None
    queue: str = ""


@dataclass(frozen=True, slots=True)
class ResultWrite:
    """Celery's result write, done by the same script as a step (only if the step applies).

    ``key`` is the backend's key for the task, ``value`` the encoded (JSON) meta it would
    store, ``expires`` its expiry in seconds (0: none), ``db`` the result backend's db when
    it is not the store's own (same server).
    """

    key: str
    value: str
    expires: int
    db: int | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Outcome of a heartbeat: accepted (and whether cancellation was requested), or
    rejected because the task is no longer started under that attempt (``state``,
    ``attempt`` say what it is now), or not delivered (Redis unreachable)."""

    accepted: bool
    cancel_requested: bool
    now_ms: int
    state: str | None = None
    attempt: int | None = None
    delivered: bool = True
