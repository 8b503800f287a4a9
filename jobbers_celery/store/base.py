"""Plain values the store returns."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.states import TaskState

__all__ = ["Alive", "CancelOutcome", "Claimed", "CleanerScan", "Giver", "Halt", "Heartbeat",
           "ResultWrite", "SentSteps", "StallVerdict", "StepResult", "Submission"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outcome of one lifecycle step.

    ``previous`` is the state before the step (``"missing"`` when there was no record);
    ``attempt`` is the attempt after it; ``state`` the state it ended in when applied (not
    always the target asked for: a pending cancellation or a concurrency cap redirects it);
    ``why`` says why a refused step was refused (``state``, ``missing``, ``stale_attempt``
    or ``other_worker``).
    """

    applied: bool
    previous: str
    now_ms: int
    attempt: int
    state: TaskState | None = None
    values: dict[str, str] = field(default_factory=dict)
    why: str | None = None
    #: the dataset's epoch id, returned by an applied step that may create the record
    epoch: str | None = None
    #: with ``write_result``: whether the script wrote Celery's result (``False``: the step
    #: was refused, or the result's db could not be selected; Celery must write it)
    result_written: bool = False


@dataclass(frozen=True, slots=True)
class Submission:
    """One publish's ``submit`` step in a batch (:meth:`StepStore.submit_many`): the
    arguments the recorder gives :meth:`StepStore.submit` for a single publish. ``fair``: a
    group's member under fair shares, parked by its step when its key has no room (its
    result's ``state`` is then ``scheduled``: no message goes)."""

    task_id: str
    name: str
    create: dict[str, str]
    fields: dict[str, str]
    reason: str = "published"
    sources: tuple[TaskState, ...] = (TaskState.UNSUBMITTED,)
    fair: FairKey | None = None


class SentSteps:
    """Steps sent to the store in one write whose replies are read later (a bulk publish
    goes on building its next members meanwhile): :meth:`results` reads them once, in the
    order sent. An entry is the step's result or the exception that stands for it (an error
    reply, or a connection lost before its reply: the step may or may not have applied).
    ``unsent``: given the ids of members whose message never went (the publish stopped at
    an error before them), gives back the places of their keys that fair shares counted
    (a store without fair shares: ``None``)."""

    __slots__ = ("_read", "_results", "_unsent")

    def __init__(self, read: Callable[[], list[StepResult | Exception]],
                 unsent: Callable[[Collection[str]], None] | None = None) -> None:
        self._read: Callable[[], list[StepResult | Exception]] | None = read
        self._results: list[StepResult | Exception] = []
        self._unsent = unsent

    def never_sent(self, task_ids: Collection[str]) -> None:
        """The members ``task_ids`` were never sent: their keys' places are given back at
        once, not after ``ON_THE_WAY_MS``. Raises what the store raises."""
        if self._unsent is not None and task_ids:
            self._unsent(task_ids)

    def results(self) -> list[StepResult | Exception]:
        if self._read is not None:
            read, self._read = self._read, None
            self._results = read()
        return self._results


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task the scheduler claimed and must publish. ``run_at`` is set when it was claimed
    because its ``run_at`` came (not when a lapsed publish lease is taken over)."""

    task_id: str
    msg: str
    retries: int
    name: str
    run_at: int | None = None
    queue: str = ""


@dataclass(frozen=True, slots=True)
class ResultWrite:
    """Celery's result write, done by the same script as a step (only if the step applies).

    ``key`` is the backend's key for the task, ``value`` the encoded (JSON) meta it would
    store, ``expires`` its expiry in seconds (0: none), ``db`` the result backend's db when
    it is not the store's own (same server).
    """

    key: str
    value: str
    expires: int
    db: int | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Outcome of a heartbeat: accepted (and whether cancellation was requested), or
    rejected because the task is no longer started under that attempt (``state``,
    ``attempt`` say what it is now), or not delivered (Redis unreachable)."""

    accepted: bool
    cancel_requested: bool
    now_ms: int
    state: str | None = None
    attempt: int | None = None
    delivered: bool = True


@dataclass(frozen=True, slots=True)
class CleanerScan:
    """What one cleaner pass must judge (``cleaner_due.lua``), by the Redis clock ``now_ms``:
    the tasks past their heartbeat deadline (``hb``), the worker incarnations not seen for
    ``worker_lost_after`` (``dead``), the stale cancellation requests to tidy (``cancel``),
    and when the last store outage or pause ended (``resumed_at_ms``, 0 if none), in one
    shard (``shard``: each shard keeps its own copy of the workers set and clock)."""

    now_ms: int
    hb: list[str]
    dead: list[str]
    cancel: list[str]
    resumed_at_ms: int = 0
    shard: int = 0


@dataclass(frozen=True, slots=True)
class StallVerdict:
    """What ``stall.lua`` decided about a batch of candidates: the tasks it resubmitted
    (``recovered``) and the ones it ended for good (``dead``), each the record fields the
    cleaner needs (``id``, ``name``, ``queue``, ``msg``, ``retries``, ``now``, ...), how
    many it stalled, and how many it left alone (``kept``)."""

    recovered: list[dict[str, str]]
    dead: list[dict[str, str]]
    stalled: int
    kept: int


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What ``cancel`` did: ``outcome`` is ``cancelled`` (at once), ``requested`` (a
    started task stops at its next heartbeat) or ``no`` (unknown or finished); ``previous``
    is the state it found."""

    outcome: str
    previous: str


class Giver(NamedTuple):
    """How a take-back judges the worker incarnation a given-back message names (ms): gone
    when not seen for ``gone_ms`` (counted from the end of an outage, as the cleaner
    counts); alive, its liveness refresh has had its chance to say it does not run the
    attempt (``alive.lua``'s not-running hash) once it was seen ``settle_ms`` after the
    attempt started."""

    gone_ms: int
    settle_ms: int


class Halt(NamedTuple):
    """A task a worker runs whose attempt the cleaner declared stalled (see ``alive.lua``)."""

    task_id: str
    verdict_ms: int  # Redis clock
    attempt: int


class Alive(NamedTuple):
    """What a liveness refresh hands back (see ``RunningStore.alive``)."""

    interrupt: list[str]
    orphans: list[str]
    halts: tuple[Halt, ...] = ()
    now_ms: int = 0
