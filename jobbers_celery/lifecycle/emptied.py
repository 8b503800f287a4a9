"""jobbers' Redis came back empty: say so once, clearly.

A Redis restarted without persistence (or flushed) loses every record; the tasks running
then end with one "refused transition missing -> ..." warning each, and nothing says the
store lost its data. The marker is the dataset's epoch (``Keys.epoch``: a random id
written at the dataset's first use, ``SET NX``, by the first step or read that needs it):
every worker's liveness thread reads it every few seconds (:meth:`EmptiedWatch.check`,
one ``SET NX`` + ``GET``). A process that saw one epoch and then finds another (the key was
gone, and the next step or this check wrote a new one) knows the data it was written with
is gone. Of all the processes that notice, the one that takes a short lease named after
the new epoch reports it, once: one ERROR log line, the ``store_emptied`` counter, and a
``store_emptied`` alert (``jobbers.alerts.emit``). A process that first meets the store
after it was emptied sees only the new epoch: nothing it knew was lost, nothing is said.

Every shard's epoch is read (:meth:`RedisStore.epochs`: one pipeline, one round trip per
node), so on a Redis Cluster a node that lost its data alone (its slots' shards) is found
whichever shard lives on it; a store without shards reads one epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, cast

from jobbers_celery.alerts.events import AlertEvent, AlertKind
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.telemetry import metrics

__all__ = ["PROBE", "REPORT_LEASE_MS", "EmptiedStore", "EmptiedWatch", "read_epochs"]

log = escaped_logger("jobbers.store")

#: The task id whose shard's epoch is read (no task of this id is ever recorded).
PROBE = "jobbers:epoch-probe"
#: How long the report's lease is held: the other processes stay silent meanwhile, and
#: adopt the new epoch at their next check.
REPORT_LEASE_MS = 10 * 60 * 1000
#: Shards named at most in the report of a partial loss.
SHARDS_SHOWN = 8


class EmptiedStore(Protocol):
    """What the watch reads: the dataset's epoch (made on first use) and a lease."""

    def epoch(self, task_id: str, max_age: float = 0.0) -> str: ...
    def try_lock(self, name: str, ttl_ms: int) -> bool: ...


def read_epochs(store: EmptiedStore) -> list[str]:
    """Every shard's epoch where the store has shards (``epochs``), else the one epoch."""
    every = getattr(store, "epochs", None)
    if callable(every):
        return list(cast("Sequence[str]", every()))
    return [store.epoch(PROBE)]


class EmptiedWatch:
    """One process's view of the dataset's epoch (see the module docstring)."""

    def __init__(self, store: EmptiedStore, emit: Callable[[AlertEvent], None],
                 prefix: str, where: str = "") -> None:
        self.store = store
        self.emit = emit
        self.prefix = prefix
        #: who noticed (a worker's hostname), for the log line and the alert
        self.where = where
        self.seen: list[str] | None = None
        #: how many times this process reported the store emptied (tests read it)
        self.reported = 0

    def check(self) -> bool:
        """Read every shard's epoch; report the store emptied if one changed since the last check
        (once, among every process that notices). Returns whether this call reported it.
        Raises what the store raises (an outage: the caller's loop logs it)."""
        now = read_epochs(self.store)
        before, self.seen = self.seen, now
        if before is None or len(before) != len(now):
            return False
        lost = [i for i, (was, is_) in enumerate(zip(before, now, strict=True)) if was != is_]
        if not lost:
            return False
        # every process that notices takes the same lease: the first shard's new epoch
        if not self.store.try_lock(f"store-emptied:{now[lost[0]]}", REPORT_LEASE_MS):
            return False  # another process reports it
        self.reported += 1
        by = f" (noticed by {self.where})" if self.where else ""
        if len(now) == 1:
            changed = f"its dataset id changed from {before[0]} to {now[0]}"
        else:
            shown = ", ".join(f"{i} ({before[i]} to {now[i]})" for i in lost[:SHARDS_SHOWN])
            more = f" and {len(lost) - SHARDS_SHOWN} more" if len(lost) > SHARDS_SHOWN else ""
            changed = (f"the dataset id of {len(lost)} of its {len(now)} shards changed: "
                       f"shard {shown}{more}")
        text = (f"jobbers' Redis store (prefix {self.prefix!r}) lost its data: "
                f"{changed}{by}. Redis was restarted without "
                "persistence, flushed, or failed over to an empty replica: the records of "
                "every task submitted before are gone (their steps are refused as "
                "'missing'), and so are scheduled retries, paced resubmits and the Redis "
                "dead-letter sink's entries. Check Redis persistence (docs/howto/"
                "redis-settings.md).")
        log.error("jobbers store emptied: %s", text)
        metrics.store_emptied(self.prefix)
        self.emit(AlertEvent(kind=AlertKind.STORE_EMPTIED, key=self.prefix,
                             title="jobbers' Redis store came back empty", text=text))
        return True
