"""Throughput, runtime, queue latency and failures per minute, per task name and per queue,
for days: the reads behind ``Jobbers.series`` (the admin's history page, the REST API and
``celery jobbers history`` print the same points).

The steps write the minutes themselves (``_lib.lua``), so this module only reads, and hands
the steps their settings (``configure``, from the workers' housekeeping). A read is bounded
(:func:`jobbers_celery.core.series.window`): at most ``jobbers_history_days`` back and
:data:`~jobbers_celery.core.series.MAX_POINTS` points; it costs one pipeline of one
``HGETALL`` per hour of the range and shard (per queue too for every task's: the total is
the sum of the queues, which the steps do not write twice).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from jobbers_celery.core.series import (
    MINUTE_MS,
    SeriesKind,
    SeriesPoint,
    SeriesRangeError,
    SeriesWindow,
    bound_name,
    downsample,
    merge,
    window,
)
from jobbers_celery.core.timefmt import iso_time

if TYPE_CHECKING:
    from jobbers_celery.store.parts import SeriesStore

__all__ = ["Series", "SeriesRead"]

#: Seconds between two writes of the settings by one process (a flushed store gets them
#: back within this).
CONFIGURE_EVERY_S = 300.0


@dataclass(frozen=True, slots=True)
class SeriesRead:
    """The points of one series: ``name`` or ``queue`` (both ``None``: every task)."""

    name: str | None
    queue: str | None
    since: datetime
    until: datetime
    step_minutes: int
    points: list[SeriesPoint]

    def as_dict(self) -> dict[str, object]:
        """The JSON the REST API and the CLI give (one shape)."""
        return {"name": self.name, "queue": self.queue,
                "since": iso_time(self.since), "until": iso_time(self.until),
                "step_minutes": self.step_minutes,
                "points": [p.as_dict() for p in self.points]}


class Series:
    """Reads the series of one jobbers namespace."""

    def __init__(self, store: SeriesStore, days: float, max_names: int) -> None:
        self.store = store
        self.days = days
        self.max_names = max_names
        self._configured_at: float | None = None

    def configure(self) -> bool:
        """Write the settings the steps read, at most every few minutes; returns whether
        it wrote."""
        now = time.monotonic()
        if self._configured_at is not None and now - self._configured_at < CONFIGURE_EVERY_S:
            return False
        self.store.series_configure(self.days, self.max_names)
        self._configured_at = now
        return True

    def read(self, *, name: str | None = None, queue: str | None = None,
             since: datetime | None = None, until: datetime | None = None,
             step: int | None = None) -> SeriesRead:
        """The points of ``[since, until)`` (default: the last hour) at ``step`` minutes
        (default by span: 1 up to 6 h, 5 up to 2 days, else 60). Raises
        :class:`~jobbers_celery.core.series.SeriesRangeError` for a range or step it
        refuses (a ``ValueError``), or both ``name`` and ``queue`` given."""
        if name is not None and queue is not None:
            raise SeriesRangeError("ask for a task name or a queue, not both")
        now_ms = self.store.now_ms()
        until_ms = _ms(until) if until is not None else now_ms
        since_ms = _ms(since) if since is not None else until_ms - 60 * MINUTE_MS
        win = window(since_ms, until_ms, step, now_ms, self.days)
        if name is not None:
            kind, keys = SeriesKind.NAME, [bound_name(name)]
        elif queue is not None:
            kind, keys = SeriesKind.QUEUE, [bound_name(queue)]
        else:  # every task: the sum of the queues the window's days saw
            kind = SeriesKind.QUEUE
            keys = self.store.series_names(SeriesKind.QUEUE, list(win.days()))
        points = downsample(merge(self.store.series_hours(kind, keys, list(win.hours()))), win)
        return SeriesRead(name, queue, _at(win.since_ms), _at(win.until_ms), win.step, points)

    def names(self, days: float = 1.0) -> tuple[list[str], list[str]]:
        """The task names and the queues with a series in the last ``days`` (at most the
        days kept)."""
        now_ms = self.store.now_ms()
        span = int(min(max(days, 1 / 1440), self.days) * 86_400_000)
        win = SeriesWindow(now_ms - span, now_ms + 1, 1)
        wanted = list(win.days())
        return (self.store.series_names(SeriesKind.NAME, wanted),
                self.store.series_names(SeriesKind.QUEUE, wanted))


def _ms(at: datetime) -> int:
    if at.tzinfo is None:
        raise SeriesRangeError("times must carry a zone (UTC)")
    return int(at.timestamp() * 1000)


def _at(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
