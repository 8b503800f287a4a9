"""InMemoryStore: the store's parts in dicts, for tests that must not need a Redis server.

One part per module, as the Redis store is cut (``store/parts.py``): the steps
(:mod:`~jobbers_celery.testing.steps`), heartbeats (:mod:`~jobbers_celery.testing.running`),
reads (:mod:`~jobbers_celery.testing.reads`), delayed tasks and publish leases
(:mod:`~jobbers_celery.testing.scheduling`), paced resubmits' runs
(:mod:`~jobbers_celery.testing.runs`), workflows (:mod:`~jobbers_celery.testing.workflows`), the dead-letter outbox and set-aside list
(:mod:`~jobbers_celery.testing.outbox`), and the housekeeping that has nothing to do in one
process (:mod:`~jobbers_celery.testing.idle`), over one shared state
(:mod:`~jobbers_celery.testing.memory`). mypy checks below that it satisfies each Protocol.

What it leaves out, on purpose: expiry after the retention period, shards, concurrency
leases across processes and the liveness of other workers (a take-back always finds the
giver gone). The Lua guards for those keep their real-Redis tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobbers_celery.testing.alerts import MemoryAlerts
from jobbers_celery.testing.fairshare import MemoryFairShares
from jobbers_celery.testing.idle import IdleHousekeeping
from jobbers_celery.testing.memory import HeartbeatSent
from jobbers_celery.testing.outbox import MemoryDeadLetters
from jobbers_celery.testing.pauses import MemoryPauses
from jobbers_celery.testing.periodic import MemoryPeriodic
from jobbers_celery.testing.reads import MemoryReads
from jobbers_celery.testing.running import MemoryRunning
from jobbers_celery.testing.runs import MemoryRuns
from jobbers_celery.testing.scheduling import MemoryScheduling
from jobbers_celery.testing.search import MemorySearch
from jobbers_celery.testing.workflows import MemoryWorkflows

if TYPE_CHECKING:
    from jobbers_celery.jobbers import JobbersStore
    from jobbers_celery.store import parts

__all__ = ["HeartbeatSent", "InMemoryStore"]


class InMemoryStore(MemoryFairShares, MemoryScheduling, MemoryPauses, MemoryRuns, MemoryRunning, MemoryReads,
                    MemoryWorkflows, MemoryDeadLetters, MemorySearch, MemoryAlerts, MemoryPeriodic,
                    IdleHousekeeping):
    """The store a JobbersTask, the recorder, the publisher, the scheduler and the cleaner
    use, in memory. Thread-safe (one lock: each step is atomic, as a Lua script is).

    ``advance(seconds)`` moves its clock forward, for delays and run_at without sleeping;
    ``heartbeats`` lists every heartbeat accepted; ``refused_counts()`` the steps refused;
    ``parked`` the dead letters waiting in the outbox (the sink did not take them).
    """


if TYPE_CHECKING:  # the fake satisfies the seams its consumers are typed on
    _steps: parts.StepStore = InMemoryStore()
    _running: parts.RunningStore = InMemoryStore()
    _reads: parts.ReadStore = InMemoryStore()
    _scheduling: parts.SchedulingStore = InMemoryStore()
    _housekeeping: parts.HousekeepingStore = InMemoryStore()
    _clock: parts.ClockStore = InMemoryStore()
    _layout: parts.LayoutStore = InMemoryStore()
    _task: parts.TaskStore = InMemoryStore()
    _scheduler: parts.SchedulerStore = InMemoryStore()
    _cleaner: parts.CleanerStore = InMemoryStore()
    _runs: parts.RunStore = InMemoryStore()
    _pacer: parts.PacerStore = InMemoryStore()
    _dead_letters: parts.DeadLetterStore = InMemoryStore()
    _workflows: parts.WorkflowStore = InMemoryStore()
    _search: parts.SearchStore = InMemoryStore()
    _pauses: parts.PauseStore = InMemoryStore()
    _series: parts.SeriesStore = InMemoryStore()
    _alerts: parts.AlertStore = InMemoryStore()
    _periodic: parts.PeriodicStore = InMemoryStore()
    _jobbers: JobbersStore = InMemoryStore()
