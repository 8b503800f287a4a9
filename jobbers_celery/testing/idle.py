"""What a worker's runtime asks the store that has nothing to do in one process.

Why: an embedded worker runs jobbers' liveness refresh, scheduler and cleaner passes (they
publish delayed retries, so they must run). In memory there are no other worker processes
to lose and no keys to expire, so the questions they ask have a fixed answer: nobody is
stalled, nothing is to prune, no outage to wait out. Kept apart from the steps so that what
the fake really models (:mod:`jobbers_celery.testing.store`) reads on its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from jobbers_celery.store.base import Alive, CleanerScan, StallVerdict
from jobbers_celery.store.keys import Keys, Shards
from jobbers_celery.store.scripts import to_json

__all__ = ["IdleHousekeeping"]


class IdleHousekeeping:
    """The housekeeping and liveness part of the store, answering "nothing to do"."""

    #: The namespace the real store would use (read by code that names its keys).
    prefix = "jobbers"
    retention_s = 604800
    sharded = False

    def __init__(self) -> None:
        self._last_pass: tuple[int, dict[str, str]] | None = None

    def now_ms(self) -> int:  # the store's own clock overrides this one
        return int(time.time() * 1000)

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)

    @property
    def shards(self) -> Shards:
        return Shards(self.prefix, 1)

    def keys_of(self, task_id: str) -> Keys:
        return self.keys

    def wait_out_outages(self, seconds: float) -> None:
        """No outage in memory: nothing to wait for."""

    def maxmemory_policy(self) -> str | None:
        return None  # nothing is evicted

    def endpoint(self) -> tuple[tuple[Any, ...], int] | None:
        return None  # no server

    def alive(self, wid: str, gaps: tuple[int, int], leases: Sequence[tuple[str, str]],
              lease_cap_ms: int, running: Sequence[str] | None = None, orphan_ms: int = 0,
              orphan_grace_ms: int | None = None,
              notes: Sequence[tuple[str, int, str]] = ()) -> Alive:
        """A liveness refresh: no task to interrupt, no orphan, no halt."""
        return Alive([], [], (), self.now_ms())

    def cleaner_due(self, gaps: tuple[int, int], lost_ms: int, limit: int
                    ) -> list[CleanerScan]:
        """No task misses its heartbeats and no worker is lost in one process."""
        return [CleanerScan(now_ms=self.now_ms(), hb=[], dead=[], cancel=[])]

    def workers(self, since_ms: int) -> list[tuple[str, int, int]]:
        return []

    def worker_tasks(self, dead: Mapping[int, Sequence[str]], limit: int
                     ) -> dict[int, dict[str, list[str]]]:
        return {}

    def stall(self, items: Sequence[tuple[str, str, str, str]], lost_ms: int, lease_ms: int,
              forget: Sequence[str] = (), shard: int | None = None) -> StallVerdict:
        return StallVerdict(recovered=[], dead=[], stalled=0, kept=len(items))

    def tidy_cancelling(self, ids: Sequence[str]) -> None:
        pass

    def record_pass(self, at_ms: int, duration_ms: float, by: str,
                    report: dict[str, Any]) -> None:
        """The cleaner's last pass, in the fields the Redis store keeps (its status reads
        them)."""
        self._last_pass = (at_ms, {"last_at": str(at_ms), "last_ms": f"{duration_ms:.3f}",
                                   "by": by, "report": to_json(report)})

    def clock(self) -> dict[str, str]:
        return {} if self._last_pass is None else dict(self._last_pass[1])

    def last_pass_age_ms(self) -> int | None:
        return None if self._last_pass is None else self.now_ms() - self._last_pass[0]

    def prune(self, limit: int = 500) -> int:
        return 0  # records do not expire in memory

    def drop_payloads(self, dead: Sequence[tuple[str, int]]) -> int:
        return 0

    def without_payload(self, ids: Sequence[str]) -> dict[str, int]:
        return {}

    def sample_counts(self, keep: int) -> bool:
        return False

    def count_history(self, since_ms: int) -> list[tuple[int, dict[str, int]]]:
        return []
