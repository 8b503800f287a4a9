"""Tasks per state over time: the workers sample :meth:`Jobbers.counts` at most once a
minute (the scheduler's housekeeping asks every few seconds; a lock per Redis-clock minute
lets one worker take it) into a sorted set capped at :data:`KEEP` samples, so a chart of
the last hour reads at most 60 small members and never scans tasks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from jobbers_celery.core.states import TaskState

if TYPE_CHECKING:
    from jobbers_celery.store import ReadStore

__all__ = ["KEEP", "CountHistory", "CountSample"]

#: Samples kept: two hours at one a minute.
KEEP = 120


@dataclass(frozen=True, slots=True)
class CountSample:
    """The number of tasks in each state at the start of one minute (Redis clock)."""

    at: datetime
    counts: dict[TaskState, int]


class CountHistory:
    """Takes and reads the count samples of one jobbers namespace."""

    def __init__(self, store: ReadStore, keep: int = KEEP) -> None:
        self.store = store
        self.keep = keep

    def sample(self) -> bool:
        """Sample the counts unless this minute has a sample; returns whether it did."""
        return self.store.sample_counts(self.keep)

    def read(self, minutes: int = 60) -> list[CountSample]:
        """The samples of the last ``minutes`` (at most ``keep``), oldest first."""
        if minutes < 1:
            raise ValueError("minutes must be at least 1")
        since = self.store.now_ms() - minutes * 60_000
        return [CountSample(at=datetime.fromtimestamp(at / 1000, tz=UTC),
                            counts={state: counts.get(state.value, 0) for state in TaskState})
                for at, counts in self.store.count_history(since)]
