"""Plain values the store returns."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Claimed", "ResultWrite", "StepResult"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outcome of one lifecycle step.

    ``previous`` is the state before the step (``"missing"`` when there was no record);
    ``attempt`` is the attempt after it; ``why`` says why a refused step was refused
    (``state``, ``missing`` or ``stale_attempt``).
    """

    applied: bool
    previous: str
    now_ms: int
    attempt: int
    values: dict[str, str] = field(default_factory=dict)
    why: str | None = None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task the scheduler claimed and must publish."""

    task_id: str
    msg: str
    retries: int
    name: str


@dataclass(frozen=True, slots=True)
class ResultWrite:
    """Celery's result write, done by the same script as a step (only if the step applies).

    ``key`` is the backend's key for the task, ``value`` the encoded (JSON) meta it would
    store, ``expires`` its expiry in seconds (0: none).
    """

    key: str
    value: str
    expires: int
