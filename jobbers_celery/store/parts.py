"""The store's seams: one Protocol per concern, each what one kind of consumer uses.

Why: every consumer used to be typed on the whole ``RedisStore`` (72 methods); typed on the
part it uses, a consumer shows what it touches, and an in-memory fake of that part alone
(``jobbers_celery.testing``) is enough to test it. ``RedisStore`` satisfies every one of
them over one sharded connection (checked by mypy in ``tests/unit/test_store_parts.py``).

A consumer that uses several parts is typed on their intersection, named at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from jobbers_celery.core.records import TaskRecord, Transition
from jobbers_celery.core.states import TaskState
from jobbers_celery.store.base import (
    Alive,
    CancelOutcome,
    Claimed,
    CleanerScan,
    Giver,
    Heartbeat,
    ResultWrite,
    StallVerdict,
    StepResult,
)
from jobbers_celery.store.keys import Keys, Shards

__all__ = ["CleanerStore", "ClockStore", "DeadLetterStore", "HousekeepingStore", "LayoutStore",
           "MetricsStore", "PacerStore", "ReadStore", "RunStore", "RunningStore",
           "SchedulerStore", "SchedulingStore", "StepStore", "TaskStore"]


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
    ) -> StepResult: ...

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


class SchedulingStore(ClockStore, Protocol):
    """Delayed tasks coming due, and the publish leases of what is being published."""

    def due(self, limit: int = 500) -> tuple[list[str], int | None]: ...
    def claim(self, ids: Sequence[str], lease_ms: int, worker: str | None
              ) -> list[Claimed]: ...
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


# Consumers that use several parts: typed on their intersection.
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
