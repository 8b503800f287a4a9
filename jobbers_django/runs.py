"""Paced resubmits on the Django sink, by their documented name: the control
(:mod:`jobbers_django.dlq.runs`) and the step (:mod:`jobbers_django.dlq.run_step`)."""

from __future__ import annotations

from jobbers_django.dlq.run_step import step
from jobbers_django.dlq.runs import (
    MAX_RATE,
    MAX_WINDOW,
    MIN_RATE,
    STEP_TASK,
    Pace,
    RunConflict,
    active,
    cancel,
    enqueue,
    pause,
    resume,
    revive,
    start,
)

__all__ = [
    "MAX_RATE",
    "MAX_WINDOW",
    "MIN_RATE",
    "STEP_TASK",
    "Pace",
    "RunConflict",
    "active",
    "cancel",
    "enqueue",
    "pause",
    "resume",
    "revive",
    "start",
    "step",
]
