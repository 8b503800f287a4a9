"""Task lifecycle states and the one transition table.

The Redis scripts enforce exactly this table: callers pass ``allowed_from(to)`` to them, so
the rule lives here once and the store only does compare-and-set against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from jobbers_celery.core.errors import InvalidTransition

__all__ = [
    "RESUBMITTABLE",
    "TERMINAL",
    "TRANSITIONS",
    "TaskState",
    "allowed_from",
    "can_transition",
    "check_transition",
]


class TaskState(StrEnum):
    """Where a task is in its life. Values are the lowercase names stored in Redis."""

    UNSUBMITTED = "unsubmitted"
    SUBMITTED = "submitted"
    STARTED = "started"
    SCHEDULED = "scheduled"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STALLED = "stalled"
    DROPPED = "dropped"


S = TaskState

#: Every legal move, as ``from -> {to, ...}``. Anything else is refused by the store.
TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    S.UNSUBMITTED: frozenset({S.SUBMITTED}),
    S.SUBMITTED: frozenset({S.STARTED, S.CANCELLED, S.DROPPED, S.SCHEDULED}),
    S.STARTED: frozenset(
        {S.COMPLETED, S.FAILED, S.CANCELLED, S.STALLED, S.DROPPED, S.SCHEDULED, S.UNSUBMITTED}
    ),
    S.SCHEDULED: frozenset({S.SUBMITTED, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset({S.SUBMITTED}),
    S.CANCELLED: frozenset({S.SUBMITTED}),
    S.STALLED: frozenset({S.SUBMITTED}),
    S.DROPPED: frozenset({S.SUBMITTED}),
}

#: States a task never leaves on its own; records in them expire after the retention period.
TERMINAL: frozenset[TaskState] = frozenset(
    {S.COMPLETED, S.FAILED, S.CANCELLED, S.STALLED, S.DROPPED}
)

#: Terminal states an operator (or automatic recovery) may send back to the broker.
RESUBMITTABLE: frozenset[TaskState] = frozenset({S.FAILED, S.CANCELLED, S.STALLED, S.DROPPED})

_SOURCES: dict[TaskState, frozenset[TaskState]] = {
    to: frozenset(src for src, targets in TRANSITIONS.items() if to in targets) for to in TaskState
}


def can_transition(current: TaskState, target: TaskState) -> bool:
    """Whether the table allows ``current -> target``."""
    return target in TRANSITIONS[current]


def allowed_from(target: TaskState) -> frozenset[TaskState]:
    """The states from which ``target`` may be entered (what the store compares against)."""
    return _SOURCES[target]


def check_transition(current: TaskState, target: TaskState) -> None:
    """Raise :class:`InvalidTransition` unless ``current -> target`` is legal."""
    if not can_transition(current, target):
        raise InvalidTransition(current, target)
