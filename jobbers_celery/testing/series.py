"""The per-minute series in memory (the ``SeriesStore`` part), written by the fake's steps
as ``series_step`` in ``_lib.lua`` writes them: the same events, minutes, hours, name
bound and cap, summed with the same :class:`~jobbers_celery.core.series.MinuteCounts`.
Left out, as the fake leaves expiry out everywhere: hours never expire."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobbers_celery.core.series import (
    DAY_MS,
    HOUR_MS,
    MINUTE_MS,
    OTHER,
    MinuteCounts,
    SeriesKind,
    bound_name,
)
from jobbers_celery.core.states import TaskState
from jobbers_celery.testing.memory import Memory

__all__ = ["MemorySeries"]

S = TaskState
_FAILED = frozenset({S.FAILED, S.STALLED, S.DROPPED})


class MemorySeries(Memory):
    """The series part of the in-memory store."""

    def __init__(self) -> None:
        super().__init__()
        #: (kind, name, hour) -> {minute field: counts}
        self._series: dict[tuple[str, str, int], dict[str, MinuteCounts]] = {}
        self._series_index: dict[tuple[str, int], set[str]] = {}
        self._series_conf: tuple[float, int] = (7.0, 200)

    def series_hours(self, kind: SeriesKind, names: Sequence[str], hours: Sequence[int]
                     ) -> list[tuple[int, dict[str, str]]]:
        with self._lock:
            out = []
            for name in names:
                for hour in hours:
                    fields = self._series.get((kind.value, name, hour))
                    if fields:
                        out.append((hour, {m: _text(c) for m, c in fields.items()}))
            return out

    def series_names(self, kind: SeriesKind, days: Sequence[int]) -> list[str]:
        with self._lock:
            found: set[str] = set()
            for day in days:
                found |= self._series_index.get((kind.value, day), set())
            return sorted(found)

    def series_configure(self, days: float, cap: int) -> None:
        with self._lock:
            self._series_conf = (days, cap)

    def _queue_latency(self, before: Mapping[str, str], cur: TaskState, now: int) -> str:
        """The field ``ql`` a start writes: how long its message waited (none for a
        take-back)."""
        entered = _entered_submitted(before) if cur is S.SUBMITTED else None
        return str(max(0, now - entered) if entered else 0)

    def _series_step(self, before: Mapping[str, str], cur: TaskState, to: TaskState,
                     now: int, attempt: int) -> None:
        """What an applied step adds (called by the fake's steps, under the lock): an
        attempt counts when it ends, with its start's queue latency."""
        if cur is S.STARTED and to is not S.STARTED:
            began = before.get("start_at")
            if attempt > 1 and before.get("retry_at"):
                began = before["retry_at"]
            ql = before.get("ql")
            counts = MinuteCounts(
                started=int(ql is not None), latency_ms=int(ql or 0),
                ended=1, runtime_ms=max(0, now - int(began)) if began else 0,
                completed=int(to is S.COMPLETED), failed=int(to in _FAILED),
                retried=int(to in (S.SCHEDULED, S.UNSUBMITTED)))
        elif to in _FAILED:
            counts = MinuteCounts(failed=1)
        else:
            return
        self._series_add(SeriesKind.NAME, bound_name(before.get("name", "")), now, counts)
        self._series_add(SeriesKind.QUEUE, bound_name(before.get("queue", "")), now, counts)

    def _series_add(self, kind: SeriesKind, name: str, now: int, counts: MinuteCounts) -> None:
        hour, minute = now // HOUR_MS, str(now // MINUTE_MS % 60)
        fields = self._series.get((kind.value, name, hour), {})
        if minute not in fields:
            index = self._series_index.setdefault((kind.value, now // DAY_MS), set())
            if name not in index:
                if len(index) >= self._series_conf[1]:
                    name = OTHER
                    fields = self._series.get((kind.value, name, hour), {})
                index.add(name)
        fields[minute] = fields.get(minute, MinuteCounts()) + counts
        self._series[(kind.value, name, hour)] = fields


def _text(c: MinuteCounts) -> str:
    return (f"{c.started} {c.latency_ms} {c.ended} {c.runtime_ms} {c.completed} {c.failed} "
            f"{c.retried}")


def _entered_submitted(rec: Mapping[str, str]) -> int | None:
    """When the record last entered ``submitted`` (its history entries count from sub_at):
    the score of the submitted index the script reads."""
    sub_at = int(rec.get("sub_at") or 0)
    for n in range(int(rec.get("hn") or 0), 0, -1):
        entry = rec.get(f"h{n}", "").split("|")
        if entry[0] == S.SUBMITTED.value and len(entry) > 1 and entry[1].lstrip("-").isdigit():
            return sub_at + int(entry[1])
    return sub_at or None
