"""The one time format: every time a person reads (admin pages, ``celery jobbers``,
``manage.py jobbers_dlq``) and every time a script reads (the REST API, ``--json``).

- A person reads ``2026-11-27 21:33:05 UTC``: to the second, with the zone written out, and
  always in UTC, whatever Django's ``TIME_ZONE`` says. Every time jobbers keeps comes from the
  Redis server's clock in UTC, and the same moment then reads the same on a page, in a
  terminal, in a worker's log and in a bug report (a page in a local zone beside a CLI in UTC
  is how two people end up an hour apart). :func:`human_time`.
- Where the age matters more than the moment (a heartbeat, a next run), a relative form beside
  it: ``3 min ago``, ``in 45 s``. :func:`relative_time`.
- A script reads ISO 8601 in UTC with milliseconds and a ``Z``:
  ``2026-11-27T21:33:05.120Z``, which :meth:`datetime.fromisoformat` (3.11+), JavaScript's
  ``Date`` and every ISO parser read back. :func:`iso_time`.

A naive datetime is taken as UTC (jobbers never makes one; a caller's own may be).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = ["HUMAN_FORMAT", "human_time", "iso_time", "relative_time", "short_duration"]

HUMAN_FORMAT = "%Y-%m-%d %H:%M:%S UTC"
NONE = "-"  # what a person reads for a time that is not there (not started, never ran)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def human_time(value: datetime | None) -> str:
    """``2026-11-27 21:33:05 UTC`` (``-`` for ``None``)."""
    return NONE if value is None else _utc(value).strftime(HUMAN_FORMAT)


def iso_time(value: datetime | None) -> str | None:
    """``2026-11-27T21:33:05.120Z`` (``None`` stays ``None``: JSON's ``null``)."""
    if value is None:
        return None
    return _utc(value).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def short_duration(delta: timedelta) -> str:
    """A length of time in its largest unit, rounded down: ``45 s``, ``3 min``, ``5 h``,
    ``12 d`` (under a minute in seconds; under two hours in minutes; under two days in
    hours). Negative lengths read as their size."""
    seconds = abs(int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def relative_time(value: datetime | None, now: datetime) -> str:
    """``3 min ago`` / ``in 45 s`` / ``now`` (under a second either way), from ``now`` (the
    Redis server's clock where the page has it, so a skewed web host does not shift ages);
    ``-`` for ``None``."""
    if value is None:
        return NONE
    delta = _utc(value) - _utc(now)
    if abs(delta) < timedelta(seconds=1):
        return "now"
    text = short_duration(delta)
    return f"in {text}" if delta > timedelta(0) else f"{text} ago"
