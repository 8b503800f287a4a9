"""Periodic tasks watched: a beat schedule's expected slots against its actual runs. Pure.

Why here: the slot arithmetic (which slots a stopped beat missed) and the bounds on what a
schedule may bring in (its name, its description) are rules, used by the watch
(:mod:`jobbers_celery.lifecycle.periodic`) and the in-memory store alike.

The three verdicts, each counted once per run or slot:

- **missed**: a slot passed ``tolerance`` ago and beat published nothing for it (beat down,
  the schedule dropped from beat, beat stuck);
- **late**: a run beat published started more than ``tolerance`` after its slot, or had not
  started ``tolerance`` after it (a backlog on its queue, its message expired unrun);
- **overlapping**: a run started while an earlier run of the same schedule still ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jobbers_celery.core.timefmt import iso_time

__all__ = ["MAX_DESCRIPTION", "MAX_NAME", "MAX_SCHEDULES", "MISSED_PER_PASS", "PeriodicRun",
           "PeriodicSchedule", "at", "bounded", "missed_slots"]

#: A schedule name longer than this is cut (names come from settings or django-celery-beat's
#: table, and go to pages, keys and metric attributes).
MAX_NAME = 200
#: A schedule's description (``<freq: 10.00 seconds>``, a crontab) is cut to this.
MAX_DESCRIPTION = 200
#: Schedules watched at most; a schedule learned beyond this is not watched (logged once).
MAX_SCHEDULES = 500
#: Missed slots one judgement records per schedule at most (a beat down for a day with a
#: one-second schedule counts the rest next pass, never 86,400 records at once).
MISSED_PER_PASS = 100


def at(ms: int | None) -> datetime | None:
    """A time in ms of the Redis clock as a UTC datetime (``None`` stays ``None``)."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def bounded(text: object, limit: int = MAX_NAME) -> str:
    """``text`` as a string of at most ``limit`` characters (what a schedule brings in)."""
    out = text if isinstance(text, str) else str(text)
    return out[:limit]


def missed_slots(next_at_ms: int, period_ms: int, judged_to_ms: int, now_ms: int,
                 tolerance_ms: int, limit: int = MISSED_PER_PASS) -> list[int]:
    """The slots ``next_at_ms + k * period_ms`` (k >= 0) after ``judged_to_ms`` that passed
    more than ``tolerance_ms`` before ``now_ms``, oldest first, at most ``limit``.

    ``next_at_ms`` is the slot beat expected next when it last published or reported: if
    it is still there, beat published nothing since. A schedule without a period
    (``period_ms <= 0``: a one-off) has one slot at most.
    """
    deadline = now_ms - tolerance_ms
    if next_at_ms <= 0 or limit <= 0 or next_at_ms > deadline:
        return []
    if period_ms <= 0:
        return [next_at_ms] if next_at_ms > judged_to_ms else []
    first = 0
    if judged_to_ms >= next_at_ms:  # the first slot after what was already judged
        first = (judged_to_ms - next_at_ms) // period_ms + 1
    last = (deadline - next_at_ms) // period_ms
    if last < first:
        return []
    return [next_at_ms + k * period_ms for k in range(first, min(last, first + limit - 1) + 1)]


@dataclass(frozen=True, slots=True)
class PeriodicRun:
    """One slot of a schedule: a run beat published (and a worker started, ended), or a
    slot missed. Times in ms of the Redis clock; ``None`` when not (yet) known."""

    id: str
    slot_at: int | None
    published_at: int | None = None
    started_at: int | None = None
    ended_at: int | None = None
    #: ``published``, ``started``, a terminal Celery state (``SUCCESS``, ``FAILURE``...)
    #: or ``missed``.
    state: str = "published"
    late: bool = False
    overlapping: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Plain data, times as ISO 8601 UTC (the REST API's and ``--json``'s form)."""
        return {"id": self.id, "state": self.state, "slot_at": iso_time(at(self.slot_at)),
                "published_at": iso_time(at(self.published_at)),
                "started_at": iso_time(at(self.started_at)),
                "ended_at": iso_time(at(self.ended_at)), "late": self.late,
                "overlapping": self.overlapping}


@dataclass(frozen=True, slots=True)
class PeriodicSchedule:
    """A schedule jobbers learned, its counts and its recent runs (newest first)."""

    name: str
    task: str
    schedule: str
    #: Where it was learned: ``beat`` (the scheduler of a running beat, default or
    #: django-celery-beat's) or ``config`` (``beat_schedule`` read by a worker).
    source: str
    period_ms: int
    next_at: int | None
    seen_at: int | None
    last_published_at: int | None
    last_started_at: int | None
    last_ended_at: int | None
    last_state: str | None
    missed: int
    late: int
    overlapping: int
    runs_total: int
    #: When beat stopped listing it (removed from beat's schedule); ``None`` while listed.
    removed_at: int | None = None
    runs: tuple[PeriodicRun, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain data, times as ISO 8601 UTC (the REST API's and ``--json``'s form)."""
        return {"name": self.name, "task": self.task, "schedule": self.schedule,
                "source": self.source, "period_seconds": self.period_ms / 1000,
                "next_at": iso_time(at(self.next_at)), "seen_at": iso_time(at(self.seen_at)),
                "last_published_at": iso_time(at(self.last_published_at)),
                "last_started_at": iso_time(at(self.last_started_at)),
                "last_ended_at": iso_time(at(self.last_ended_at)),
                "last_state": self.last_state, "missed": self.missed, "late": self.late,
                "overlapping": self.overlapping, "runs_total": self.runs_total,
                "removed_at": iso_time(at(self.removed_at)),
                "runs": [r.as_dict() for r in self.runs]}
