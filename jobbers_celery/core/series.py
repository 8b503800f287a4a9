"""Per-minute series of what tasks did: the rules the store's ``_lib.lua`` writes by and the
reads downsample by. Pure.

Why minutes in hour hashes: every lifecycle step that ends an attempt (or a task, as a
failure) adds to the minute it happened in (Redis clock), inside the step's own script, so
history costs no round trip; the attempt's queue latency, measured by its start, rides in
its record (field ``ql``) until then. A minute is one field (``"0"`` .. ``"59"``) of its
hour's hash, one hash per (task name, hour) and (queue, hour); every task's series is the
sum of the queues'. Its value is seven numbers (:class:`MinuteCounts`). Sixty short fields keep each hash in Redis's compact listpack
encoding, so a name busy every minute costs about what ``bench/history_memory.py`` measures
(docs/howto/history.md), and a quiet one only its busy minutes. Hours expire
``jobbers_history_days`` after they end; past ``jobbers_history_max_names`` names (or
queues) a day, a new one counts under :data:`OTHER`: names come from messages, so their
number and length are bounded (:data:`MAX_NAME` bytes, as the script cuts them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from jobbers_celery.core.timefmt import iso_time

__all__ = ["DAY_MS", "HOUR_MS", "MAX_NAME", "MAX_POINTS", "MINUTE_MS", "OTHER", "STEPS",
           "MinuteCounts", "SeriesKind", "SeriesPoint", "SeriesRangeError", "SeriesWindow",
           "bound_name", "downsample", "merge", "parse_span", "short_ms", "step_for", "total",
           "window"]

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
#: Bytes of a name or queue kept (``SERIES_LEN`` in ``_lib.lua``; cut at a character).
MAX_NAME = 200
#: The name that counts a day's names past ``jobbers_history_max_names``.
OTHER = "~other"
#: The steps a read may ask for, in minutes.
STEPS: tuple[int, ...] = (1, 5, 15, 60)
#: Points one read returns at most (7 days at one an hour is 168).
MAX_POINTS = 1500
_SPAN = re.compile(r"^\s*(\d{1,6})\s*(s|m|min|h|d)?\s*$")
_UNIT_MS = {"s": 1000, "m": MINUTE_MS, "min": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS}
_CUT_CHAR = re.compile(rb"[\xc0-\xff][\x80-\xbf]*\Z")


class SeriesKind(StrEnum):
    """What a series is kept per: a task name or a queue (every task's is the sum of the
    queues')."""

    NAME = "n"
    QUEUE = "q"


class SeriesRangeError(ValueError):
    """A range or step a read refuses (the API answers 400, the CLI exits 2)."""


def bound_name(name: str) -> str:
    """``name`` as the script keeps it: cut to :data:`MAX_NAME` bytes of UTF-8, and then
    without its last (maybe cut) character, exactly as ``_lib.lua`` does."""
    raw = name.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_NAME:
        return name
    return _CUT_CHAR.sub(b"", raw[:MAX_NAME]).decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class MinuteCounts:
    """One minute's (or several summed) numbers, in the stored order."""

    started: int = 0
    latency_ms: int = 0
    ended: int = 0
    runtime_ms: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0

    @classmethod
    def parse(cls, text: str) -> MinuteCounts:
        """The stored value ``"s ql e rt n f r"``; anything unreadable counts as zero (a
        field is never trusted to be well-formed: it is bounded to seven numbers)."""
        values: list[int] = []
        for part in text[:200].split()[:7]:
            try:
                values.append(max(0, int(float(part))))
            except ValueError:
                values.append(0)
        return cls(*values)

    def __add__(self, other: MinuteCounts) -> MinuteCounts:
        return MinuteCounts(self.started + other.started, self.latency_ms + other.latency_ms,
                            self.ended + other.ended, self.runtime_ms + other.runtime_ms,
                            self.completed + other.completed, self.failed + other.failed,
                            self.retried + other.retried)


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One bucket of ``minutes`` minutes starting at ``at`` (UTC)."""

    at: datetime
    minutes: int
    counts: MinuteCounts

    @property
    def completed(self) -> int:
        return self.counts.completed

    @property
    def failed(self) -> int:
        """Tasks that ended failed, stalled or dropped."""
        return self.counts.failed

    @property
    def throughput(self) -> int:
        """Tasks that ended in the bucket (completed and failed)."""
        return self.counts.completed + self.counts.failed

    @property
    def failure_rate(self) -> float | None:
        """Failed among those that ended; ``None`` when none ended."""
        ended = self.throughput
        return self.counts.failed / ended if ended else None

    @property
    def mean_runtime_ms(self) -> float | None:
        """Mean run time of the attempts that ended (retried ones too)."""
        c = self.counts
        return c.runtime_ms / c.ended if c.ended else None

    @property
    def mean_latency_ms(self) -> float | None:
        """Mean time the attempts that started waited in their queue."""
        c = self.counts
        return c.latency_ms / c.started if c.started else None

    def as_dict(self) -> dict[str, object]:
        """The JSON shape the REST API and the CLI print (one for both)."""
        c = self.counts
        return {"at": iso_time(self.at), "minutes": self.minutes,
                "throughput": self.throughput, "completed": c.completed, "failed": c.failed,
                "retried": c.retried, "started": c.started, "failure_rate": self.failure_rate,
                "mean_runtime_ms": self.mean_runtime_ms,
                "mean_latency_ms": self.mean_latency_ms}


@dataclass(frozen=True, slots=True)
class SeriesWindow:
    """A validated read: ``[since_ms, until_ms)`` aligned on ``step`` minutes."""

    since_ms: int
    until_ms: int
    step: int

    @property
    def points(self) -> int:
        return (self.until_ms - self.since_ms) // (self.step * MINUTE_MS)

    def hours(self) -> range:
        """The hour numbers (ms // HOUR_MS) whose hashes hold the window's minutes."""
        return range(self.since_ms // HOUR_MS, (self.until_ms - 1) // HOUR_MS + 1)

    def days(self) -> range:
        return range(self.since_ms // DAY_MS, (self.until_ms - 1) // DAY_MS + 1)


def step_for(span_ms: int) -> int:
    """The step a span is drawn at by default: minutes up to 6 h, 5 min up to 2 days, else
    an hour (at most 288 points for 24 h, 168 for 7 days)."""
    if span_ms <= 6 * HOUR_MS:
        return 1
    if span_ms <= 2 * DAY_MS:
        return 5
    return 60


def window(since_ms: int, until_ms: int, step: int | None, now_ms: int,
           days: float) -> SeriesWindow:
    """Check and align a read of ``[since_ms, until_ms)``: ``since`` before ``until``, no
    further back than ``days`` (what is kept), not after the current minute, a step of
    :data:`STEPS` (default :func:`step_for`) and at most :data:`MAX_POINTS` points. The
    ends are widened to whole steps. Raises :class:`SeriesRangeError`."""
    if until_ms <= since_ms:
        raise SeriesRangeError("since must be before until")
    oldest = now_ms - int(days * DAY_MS)
    if until_ms <= oldest:
        raise SeriesRangeError(f"the range ends before the {days:g} days kept "
                               "(jobbers_history_days)")
    if since_ms > now_ms:
        raise SeriesRangeError("the range starts in the future")
    since_ms = max(since_ms, oldest - oldest % MINUTE_MS)
    until_ms = min(until_ms, now_ms - now_ms % MINUTE_MS + MINUTE_MS)
    if step is None:
        step = step_for(until_ms - since_ms)
    if step not in STEPS:
        raise SeriesRangeError(f"step must be one of {', '.join(map(str, STEPS))} minutes")
    step_ms = step * MINUTE_MS
    since_ms -= since_ms % step_ms
    until_ms += -until_ms % step_ms
    out = SeriesWindow(since_ms, until_ms, step)
    if out.points > MAX_POINTS:
        raise SeriesRangeError(f"{out.points} points: at most {MAX_POINTS} a read; ask for a "
                               "larger step or a shorter range")
    return out


def downsample(minutes: Mapping[int, MinuteCounts], win: SeriesWindow) -> list[SeriesPoint]:
    """``minutes`` (minute number ``ms // MINUTE_MS`` -> counts) summed into the window's
    buckets, oldest first, one point per bucket (empty buckets included)."""
    first = win.since_ms // MINUTE_MS
    buckets = [MinuteCounts()] * win.points
    for minute, counts in minutes.items():
        i = (minute - first) // win.step
        if 0 <= i < len(buckets) and minute >= first:
            buckets[i] = buckets[i] + counts
    return [SeriesPoint(datetime.fromtimestamp((win.since_ms + i * win.step * MINUTE_MS) / 1000,
                                               tz=UTC), win.step, c)
            for i, c in enumerate(buckets)]


def merge(hours: Iterable[tuple[int, Mapping[str, str]]]) -> dict[int, MinuteCounts]:
    """Hour hashes as stored (``(hour, {minute field: value})``, several per hour when the
    dataset has shards) summed by minute number. Fields that are not a minute are skipped."""
    out: dict[int, MinuteCounts] = {}
    for hour, fields in hours:
        for field, value in fields.items():
            if not (field.isdigit() and len(field) <= 2 and int(field) < 60):
                continue
            minute = hour * 60 + int(field)
            counts = MinuteCounts.parse(value)
            before = out.get(minute)
            out[minute] = counts if before is None else before + counts
    return out


def parse_span(text: str) -> int:
    """A span as people write it, ``"90m"``, ``"24h"``, ``"7d"``, ``"30s"`` (a bare number
    is minutes), in ms. Raises :class:`SeriesRangeError`."""
    match = _SPAN.match(text[:32])
    if match is None:
        raise SeriesRangeError(f"not a span (like 90m, 24h, 7d): {text[:32]!r}")
    value = int(match.group(1)) * _UNIT_MS[match.group(2) or "m"]
    if value <= 0:
        raise SeriesRangeError("a span must be longer than zero")
    return value


def total(points: Iterable[SeriesPoint]) -> SeriesPoint | None:
    """Every point summed into one (its ``at`` the first's, its ``minutes`` the sum);
    ``None`` for no points."""
    points = list(points)
    if not points:
        return None
    counts = MinuteCounts()
    for p in points:
        counts = counts + p.counts
    return SeriesPoint(points[0].at, sum(p.minutes for p in points), counts)


def short_ms(ms: float | None) -> str:
    """A mean time as a person reads it: ``-`` (none), ``340 ms``, ``3.4 s``, ``12 s``,
    ``4.5 min``, ``2.1 h``."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 10_000:
        return f"{ms / 1000:.1f} s"
    if ms < 120_000:
        return f"{ms / 1000:.0f} s"
    if ms < 2 * HOUR_MS:
        return f"{ms / MINUTE_MS:.1f} min"
    return f"{ms / HOUR_MS:.1f} h"
