"""The store's seams: one Protocol per concern, each what one kind of consumer uses.

Why: every consumer used to be typed on the whole ``RedisStore`` (72 methods); typed on the
part it uses, a consumer shows what it touches, and an in-memory fake of that part alone
(``jobbers_celery.testing``) is enough to test it. ``RedisStore`` satisfies every one of
them over one sharded connection (checked by mypy in ``tests/unit/test_store_parts.py``).

A consumer that uses several parts is typed on their intersection, named at the end.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from jobbers_celery.core.fairshare import FairHeld, FairKey, Released
from jobbers_celery.core.pauses import Pause, PauseKind
from jobbers_celery.core.periodic import PeriodicSchedule
from jobbers_celery.core.ratelimit import RateKey
from jobbers_celery.core.records import TaskRecord, Transition
from jobbers_celery.core.series import SeriesKind
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import UniqueInfo
from jobbers_celery.core.workflow import WorkflowRead
from jobbers_celery.store.base import (
    Alive,
    CancelOutcome,
    Claimed,
    CleanerScan,
    Giver,
    Heartbeat,
    ResultWrite,
    SentSteps,
    StallVerdict,
    StepResult,
    Submission,
)
from jobbers_celery.store.keys import Keys, Shards

__all__ = ["AlertStore", "CleanerStore", "ClockStore", "DeadLetterStore", "FairStore", "HousekeepingStore", "LayoutStore",
           "MetricsStore", "PacerStore", "PauseStore", "PeriodicStore",
           "ReadStore", "RunStore", "RunningStore",
           "SchedulerStore", "SchedulingStore", "SearchStore", "SeriesStore", "StepStore", "TaskStore",
           "WorkflowStore"]


class LayoutStore(Protocol):
    """The dataset's namespace and shards, and where the connection goes."""

    @property
    def keys(self) -> Keys: ...
    @property
    def retention_s(self) -> int: ...
    @property
    def shards(self) -> Shards: ...
    @property
    def sharded(self) -> bool: ...
    def keys_of(self, task_id: str) -> Keys: ...
    def wait_out_outages(self, seconds: float) -> None: ...
    def endpoint(self) -> tuple[tuple[Any, ...], int] | None:
        """``(server and user, db)`` the connection talks to; ``None`` on Redis Cluster."""


class ClockStore(Protocol):
    """The Redis clock, and the best-effort locks and leases that run by it."""

    @property
    def keys(self) -> Keys: ...
    def now_ms(self) -> int: ...
    def try_lock(self, name: str, ttl_ms: int) -> bool: ...
    def hold_lease(self, key: str, token: str, ttl_ms: int) -> bool: ...


class StepStore(Protocol):
    """The lifecycle steps (the recorder's): each one script call, one round trip."""

    def submit(
        self,
        task_id: str,
        *,
        sources: Iterable[TaskState],
        reason: str,
        name: str | None = None,
        create: dict[str, str] | None = None,
        fields: dict[str, str] | None = None,
        delete: Sequence[str] = (),
        lease_ms: int | None = None,
        ret: Sequence[str] = (),
        later: tuple[int, str] | None = None,
        fair: FairKey | None = None,
        need: str | None = None,
    ) -> StepResult: ...

    def submit_many(self, items: Sequence[Submission]) -> SentSteps:
        """The ``submit`` steps of a bulk publish's members, built as :meth:`submit` builds
        each and sent in one write (per server) without waiting: the records exist once
        :meth:`SentSteps.results` has their replies, never before."""
        ...

    def start(
        self,
        task_id: str,
        *,
        name: str,
        worker: str | None,
        wid: str,
        heartbeat_ms: int | None,
        cap: int | None,
        lease_cap_ms: int,
        defer_ms: int,
        fields: dict[str, str],
        rate: RateKey | None = None,
        fair: FairKey | None = None,
    ) -> StepResult: ...

    def complete(
        self,
        task_id: str,
        fence: int,
        *,
        name: str,
        worker: str | None,
        wid: str,
        fields: dict[str, str],
        delete: Sequence[str],
        write_result: ResultWrite | None,
        reason: str | None = None,
    ) -> StepResult: ...

    def end(
        self,
        task_id: str,
        to: TaskState,
        *,
        fence: int | None = None,
        wid_fence: str | None = None,
        wid: str,
        name: str,
        worker: str | None,
        reason: str,
        fields: dict[str, str] | None = None,
        ret: Sequence[str] = (),
        cancellable: bool = False,
        cancel_reason: str | None = None,
        delay_ms: int | None = None,
        lease_ms: int | None = None,
        expect_refusal: bool = False,
        giver: Giver | None = None,
    ) -> StepResult: ...

    def unstarted(
        self,
        task_id: str,
        to: TaskState,
        *,
        reason: str,
        worker: str | None = None,
        fields: dict[str, str] | None = None,
        ret: Sequence[str] = (),
    ) -> StepResult: ...

    def step(
        self,
        task_id: str,
        to: TaskState,
        *,
        sources: Iterable[TaskState] | None = None,
        fence: int | None = None,
        wid_fence: str | None = None,
        create: dict[str, str] | None = None,
        set_fields: dict[str, str] | None = None,
        delete: Sequence[str] = (),
        start: bool = False,
        bump: bool = False,
        wid: str | None = None,
        heartbeat_ms: int | None = None,
        cap: int | None = None,
        lease_cap_ms: int = 60_000,
        defer_ms: int = 1000,
        cancellable: bool = False,
        cancel_reason: str | None = None,
        delay_ms: int | None = None,
        lease_ms: int | None = None,
        worker: str | None = None,
        reason: str | None = None,
        ret: Sequence[str] = (),
        name: str | None = None,
        write_result: ResultWrite | None = None,
        expect_refusal: bool = False,
        later: tuple[int, str] | None = None,
        giver: Giver | None = None,
        gone_fence: bool = False,
        need: str | None = None,
    ) -> StepResult: ...

    def cancel(
        self,
        task_id: str,
        reason: str,
        terminate_ms: int | None = None,
        set_fields: dict[str, str] | None = None,
        keep_reason: bool = False,
    ) -> CancelOutcome: ...

    def epoch(self, task_id: str, max_age: float = 0.0) -> str: ...
    def recheck_master(self) -> bool:
        """Have the next commands ask Redis Sentinel for the master first; ``False`` when
        the store is not on Sentinel (nothing to ask again)."""
        ...


class RunningStore(Protocol):
    """What a worker sends while its tasks run: heartbeats and its liveness refresh."""

    def heartbeat(
        self,
        task_id: str,
        fence: int,
        *,
        progress: str | None = None,
        checkpoint: str | None = None,
        name: str | None = None,
        lease_cap_ms: int | None = None,
    ) -> Heartbeat: ...

    def alive(
        self, wid: str, gaps: tuple[int, int], leases: Sequence[tuple[str, str]],
        lease_cap_ms: int, running: Sequence[str] | None = None, orphan_ms: int = 0,
        orphan_grace_ms: int | None = None, notes: Sequence[tuple[str, int, str]] = (),
    ) -> Alive: ...


class ReadStore(ClockStore, Protocol):
    """Records, histories, listings and counts (each walks an index, never the keyspace)."""

    def get(self, task_id: str) -> TaskRecord | None: ...
    def started_by(self, task_id: str, wid: str) -> StepResult | None: ...
    def get_raw(self, task_id: str) -> dict[str, str]: ...
    def history(self, task_id: str) -> list[Transition]: ...
    def fields(self, ids: Sequence[str], names: Sequence[str]) -> list[list[str | None]]: ...
    def counts(self) -> dict[TaskState, int]: ...
    def sample_counts(self, keep: int) -> bool: ...
    def count_history(self, since_ms: int) -> list[tuple[int, dict[str, int]]]: ...
    def scheduled(self, limit: int = 100) -> list[TaskRecord]: ...

    def tasks(
        self,
        state: TaskState | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        worker: str | None = None,
    ) -> list[TaskRecord]: ...

    def refused_counts(self) -> dict[str, int]: ...


class SeriesStore(ClockStore, Protocol):
    """The per-minute series' reads and settings (the steps write them; see
    :mod:`jobbers_celery.core.series`)."""

    def series_hours(self, kind: SeriesKind, names: Sequence[str], hours: Sequence[int]
                     ) -> list[tuple[int, dict[str, str]]]:
        """The stored hour hashes of ``kind`` and ``names`` among ``hours`` (per shard)."""
    def series_names(self, kind: SeriesKind, days: Sequence[int]) -> list[str]: ...
    def series_configure(self, days: float, cap: int) -> None: ...


class SearchStore(Protocol):
    """The argument search's reads (:mod:`jobbers_celery.core.search`)."""

    def indexed(self, key: str, limit: int) -> list[TaskRecord]:
        """The newest ``limit`` tasks the argument index ``key`` (a digest) holds."""
    def recent(self, name: str | None, limit: int
               ) -> tuple[list[tuple[TaskRecord, str | None]], int]:
        """The newest ``limit`` records of ``name`` (``None``: any) with their payloads,
        and how many its index holds."""


class UniqueStore(Protocol):
    """Unique tasks' locks, read (:mod:`jobbers_celery.store.unique`)."""

    def unique_holder(self, digest: str) -> str | None:
        """The id of the copy holding the lock of key ``digest``, ``None`` if free."""
    def unique_of(self, task_id: str) -> UniqueInfo | None:
        """The lock of a unique task (``None``: not one), with its holder now."""


class WorkflowStore(ClockStore, Protocol):
    """Canvases as units: a workflow's members (its index, written by each member's
    ``submit`` step, see :mod:`jobbers_celery.core.workflow`) and its cancel mark."""

    def workflow(self, task_id: str, limit: int) -> WorkflowRead | None:
        """The workflow ``task_id`` names (a member's id, a workflow key or a group id):
        its first ``limit`` members by submission time with their records and histories;
        ``None`` if it names none (a task published alone is a workflow of one)."""

    def mark_workflow_cancelled(self, root_id: str, cancelled: bool) -> None:
        """Set (or clear) the workflow's cancel mark: while set, a member recorded at its
        publish is cancelled at once by the same step."""


class RateLimitStore(Protocol):
    """Rate limits keyed by arguments (:mod:`jobbers_celery.store.ratelimits`): the
    operators' overrides, and how many tasks wait on a limit."""

    def rate_overrides(self) -> dict[str, str]: ...
    def set_rate_override(self, name: str, text: str) -> str: ...
    def clear_rate_override(self, name: str) -> bool: ...
    def rate_held(self, names: Iterable[str]) -> dict[str, int]: ...


class HousekeepingStore(ClockStore, Protocol):
    """The cleaner's scans and verdicts, purges and pruning, payload dropping."""

    def cleaner_due(self, gaps: tuple[int, int], lost_ms: int, limit: int
                    ) -> list[CleanerScan]: ...
    def workers(self, since_ms: int) -> list[tuple[str, int, int]]: ...
    def worker_tasks(self, dead: Mapping[int, Sequence[str]], limit: int
                     ) -> dict[int, dict[str, list[str]]]: ...
    def drop_payloads(self, dead: Sequence[tuple[str, int]]) -> int: ...
    def without_payload(self, ids: Sequence[str]) -> dict[str, int]: ...

    def stall(
        self,
        items: Sequence[tuple[str, str, str, str]],
        lost_ms: int,
        lease_ms: int,
        forget: Sequence[str] = (),
        shard: int | None = None,
    ) -> StallVerdict: ...

    def tidy_cancelling(self, ids: Sequence[str]) -> None: ...
    def record_pass(self, at_ms: int, duration_ms: float, by: str,
                    report: dict[str, Any]) -> None: ...
    def clock(self) -> dict[str, str]: ...
    def last_pass_age_ms(self) -> int | None: ...
    def remove_terminal(self, ids: Sequence[str]) -> int: ...
    def purge(
        self, name: str | None, queue: str | None, before_ms: int | None
    ) -> tuple[int, list[str], list[str]]: ...
    def prune(self, limit: int = 500) -> int: ...
    def maxmemory_policy(self) -> str | None: ...


class FairStore(Protocol):
    """Fair shares: the release pass and what is held back (store/fairshare.py)."""

    def fair_release(self, limit: int = ...,
                     keys: Sequence[tuple[str, str]] | None = None) -> Released: ...
    def fair_unreleased(self, ids: Sequence[tuple[str, str, str]]) -> None: ...
    def fair_held(self, limit: int = 100) -> list[FairHeld]: ...


class SchedulingStore(ClockStore, FairStore, Protocol):
    """Delayed tasks coming due (parked ones too, see FairStore), and the publish leases of
    what is being published."""

    def due(self, limit: int = 500) -> tuple[list[str], int | None]: ...
    def claim(self, ids: Sequence[str], lease_ms: int, worker: str | None,
              released: Collection[str] = ()) -> list[Claimed]: ...
    def release_publish_leases(self, ids: Sequence[str]) -> None: ...
    def confirm_published(self, ids: Iterable[str]) -> None: ...


class RunStore(ClockStore, Protocol):
    """The records of paced resubmits (``run_*.lua``)."""

    def run_keys(self, run_id: int) -> list[str]: ...
    def create_run(self, fields: Mapping[str, str | int | float], members: Sequence[str],
                   event: str) -> int: ...
    def active_runs(self, limit: int) -> list[int]: ...
    def runs(self, limit: int) -> list[int]: ...
    def run(self, run_id: int
            ) -> tuple[dict[str, str], int, int, list[str], dict[str, str]] | None: ...
    def run_fields(self, run_id: int, names: Sequence[str]) -> list[str | None]: ...
    def claim_run(self, run_id: int, most: int) -> list[str]: ...
    def run_unsettled(self, run_id: int, limit: int) -> tuple[list[str], dict[str, int]]: ...
    def settle_run(self, run_id: int, outcomes: Sequence[tuple[str, str, str]],
                   window: int) -> tuple[str, str]: ...
    def control_run(self, run_id: int, action: str, by: str) -> tuple[bool, str]: ...


class DeadLetterStore(Protocol):
    """The default sink's entries (JSON text under ``<task id>:<attempt>``, indexed by
    failure time), the dispatcher's outbox and the set-aside list: raw text in, raw text
    out (the dead-letter wing reads and writes the JSON)."""

    def put_entries(self, entries: Sequence[tuple[str, str, float]], *, atomic: bool
                    ) -> None:
        """``(member, JSON, failed at)`` each, kept if absent (idempotent)."""

    def entry_count(self) -> int: ...
    def entry_text(self, member: str) -> str | None: ...
    def entry_texts(self, offset: int, count: int) -> list[str | None]:
        """The JSON of the entries ``offset`` to ``offset + count - 1``, newest first
        (``None``: an index entry without its entry); ``[]`` past the end."""
    def entries_matching(self, pattern: str) -> Iterator[tuple[str, str]]:
        """``(member, JSON)`` of the members matching the glob ``pattern`` (a scan)."""
    def remove_entries(self, members: Sequence[str]) -> int: ...
    def outbox_push(self, texts: Sequence[str]) -> None: ...
    def outbox_head(self) -> str | None: ...
    def outbox_remove(self, text: str) -> None: ...
    def set_aside_push(self, item: str, keep: int) -> int:
        """Add ``item`` to the set-aside list, keep the newest ``keep``, count it; the
        list's length before trimming."""
    def set_aside_read(self, limit: int) -> tuple[list[str], int, int]:
        """The newest ``limit`` items, how many are kept, how many were ever added."""


class PeriodicStore(ClockStore, Protocol):
    """The beat watch (``periodic.lua``): schedules learned, their runs, missed slots."""

    def periodic_learn(self, name: str, fields: Mapping[str, str],
                       next_in_ms: int | None) -> bool: ...
    def periodic_remove(self, name: str) -> bool: ...
    def periodic_publish(self, name: str, task_id: str, task: str, slot_in_ms: int,
                         next_in_ms: int | None, keep: int, tolerance_ms: int) -> int: ...
    def periodic_start(self, name: str, task_id: str, task: str, keep: int,
                       tolerance_ms: int, stale_ms: int, age_ms: float = 0
                       ) -> tuple[bool, list[str]]: ...
    def periodic_end(self, name: str, task_id: str, state: str,
                     age_ms: float = 0) -> list[str]: ...
    def periodic_missed(self, name: str, judged_to: str, slots: Sequence[int],
                        keep: int) -> int: ...
    def periodic_late(self, name: str, tolerance_ms: int) -> list[str]: ...
    def periodic_names(self) -> list[str]: ...
    def periodic_state(self, name: str) -> dict[str, str]: ...
    def periodic_schedules(self, runs: int) -> list[PeriodicSchedule]: ...


# Consumers that use several parts: typed on their intersection.
class AlertStore(Protocol):
    """The alerts' dedupe marks and rate counters, shared by every process."""

    def alert_mark(self, digest: str, ttl_ms: int) -> bool: ...
    def alert_extend(self, digest: str, ttl_ms: int) -> None: ...
    def alert_unmark(self, digest: str) -> None: ...
    def alert_count(self, digest: str, ttl_ms: int) -> int: ...


class PauseStore(ClockStore, Protocol):
    """Pauses of a task name or a queue, and the tasks held by a paused name
    (:mod:`jobbers_celery.store.pauses`)."""

    def pause(self, kind: PauseKind, target: str, by: str) -> bool: ...
    def unpause(self, kind: PauseKind, target: str) -> bool: ...
    def pauses(self) -> list[Pause]: ...
    def hold(self, task_id: str, name: str, *, worker: str | None, reason: str
             ) -> StepResult: ...
    def held_ids(self, name: str, limit: int = 500) -> list[list[str]]: ...
    def held_count(self, name: str) -> int: ...
    def release(self, name: str, ids: Sequence[str], *, lease_ms: int, worker: str | None,
                reason: str) -> list[Claimed] | None: ...
    def oldest_submitted(self, queues: Sequence[str], scan: int = 2000
                         ) -> dict[str, tuple[int, str]]: ...


class SchedulerStore(SchedulingStore, HousekeepingStore, Protocol):
    """The scheduler: delayed tasks, publish leases, and pruning."""


class CleanerStore(HousekeepingStore, SchedulingStore, ReadStore, Protocol):
    """The cleaner: its scans and verdicts, republishing what it recovered."""


class PacerStore(RunStore, ReadStore, Protocol):
    """Paced resubmits: the run records and the states of their members' tasks."""


class MetricsStore(ReadStore, HousekeepingStore, Protocol):
    """The metric gauges: counts, the cleaner's last pass, the reporting lease."""


class TaskStore(StepStore, RunningStore, ReadStore, Protocol):
    """A JobbersTask's own reads and heartbeats besides its steps."""
