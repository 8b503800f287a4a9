"""What a paced resubmit is, for both sinks: its status, its pace and stop rule, what a reader
sees of it, and THE settle rule (:func:`run_outcome`) by which each resubmitted task counts as
completed, failed again or ended otherwise.

The Redis sink's runs (:mod:`jobbers_celery.resubmit.pacer`) and the Django sink's
(``jobbers_django.dlq``) both go by these values, so that a run halts for the same reasons
whichever sink holds the dead letters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.core.states import RESUBMITTABLE, TaskState
from jobbers_celery.core.timefmt import iso_time

__all__ = [
    "CONTROL",
    "FAILED_AGAIN",
    "FINAL",
    "MAX_RATE",
    "MAX_RUN_ENTRIES",
    "MAX_RUN_SECONDS",
    "MAX_WINDOW",
    "MIN_RATE",
    "RATE_MESSAGE",
    "SETTLED",
    "PaceError",
    "ResubmitPace",
    "ResubmitRunInfo",
    "RunAction",
    "RunOutcome",
    "RunStatus",
    "allowance",
    "control_sources",
    "control_transition",
    "halt_reason",
    "rule_text",
    "run_outcome",
    "stop_rule",
]

#: Fastest pace, tasks per second (both sinks).
MAX_RATE = 500.0
#: Slowest pace, tasks per second (one task every 10 s): slower, a run would outlast
#: ``MAX_RUN_SECONDS`` (at ``1e-300`` it would never end).
MIN_RATE = 0.1
#: Most entries one run takes: the CLI's largest ``--limit`` (the Django sink's requests
#: take at most 1,000).
MAX_RUN_ENTRIES = 10_000
#: The longest a run publishes at its pace: ``MAX_RUN_ENTRIES`` at ``MIN_RATE`` (100,000 s,
#: under 28 hours; pauses not counted).
MAX_RUN_SECONDS = MAX_RUN_ENTRIES / MIN_RATE
#: Why a rate is refused (every front end says the same).
RATE_MESSAGE = (f"must be a number of tasks per second, at least {MIN_RATE:g} and at most "
                f"{MAX_RATE:g} (a run publishes at most {MAX_RUN_ENTRIES:,} entries within "
                f"{MAX_RUN_SECONDS:,.0f} s)")
#: Largest stop-rule window (``of_last``); the window list keeps this many outcomes.
MAX_WINDOW = 1000

#: A resubmitted task that ends in one of these failed again (the docs' "settle" step).
FAILED_AGAIN = frozenset({TaskState.FAILED, TaskState.DROPPED, TaskState.STALLED,
                          TaskState.CANCELLED})


class RunStatus(StrEnum):
    """queued, running, paused; or, final: halted (by the stop rule), cancelled, done."""

    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"
    CANCELLED = "cancelled"
    DONE = "done"


#: Statuses in which a run moves no more by itself (finished): only an operator's
#: ``continue`` moves a halted run again (cancelled and done are for good).
FINAL = frozenset({RunStatus.HALTED, RunStatus.CANCELLED, RunStatus.DONE})


class RunAction(StrEnum):
    """What an operator does to a run."""

    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    #: a halted run goes on (its cause fixed): at its pace counted from now, the stop
    #: rule's window emptied (the failures that halted it are not counted again)
    CONTINUE = "continue"


#: THE control table, for both sinks: each action, the statuses it moves a run from, and
#: the status it moves it to. ``run_control.lua`` keeps a copy (it runs in Redis;
#: tests/integration/test_run_control_parity.py compares the two).
CONTROL: dict[RunAction, tuple[frozenset[RunStatus], RunStatus]] = {
    RunAction.PAUSE: (frozenset({RunStatus.QUEUED, RunStatus.RUNNING}), RunStatus.PAUSED),
    RunAction.RESUME: (frozenset({RunStatus.PAUSED}), RunStatus.RUNNING),
    RunAction.CANCEL: (frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PAUSED}),
                       RunStatus.CANCELLED),
    RunAction.CONTINUE: (frozenset({RunStatus.HALTED}), RunStatus.RUNNING),
}


def control_sources(action: RunAction | str) -> frozenset[RunStatus]:
    """The statuses ``action`` applies to (the others refuse it)."""
    return CONTROL[RunAction(action)][0]


def control_transition(status: RunStatus | str, action: RunAction | str) -> RunStatus | None:
    """The status ``action`` moves a run in ``status`` to, or ``None``: not allowed now."""
    sources, target = CONTROL[RunAction(action)]
    return target if status in sources else None


class RunOutcome(StrEnum):
    """A run member's fate. The values are the one-letter codes the Redis sink's run keeps
    (``run_settle.lua``); the Django sink's ``ItemOutcome`` names the settled ones."""

    #: handed to the broker, outcome not known yet
    PUBLISHED = "p"
    #: not published: not resubmittable (someone else resubmitted it, or it cannot be)
    SKIPPED = "s"
    #: the publish failed; the entry stays dead
    PUBLISH_FAILED = "x"
    COMPLETED = "c"
    FAILED_AGAIN = "f"
    #: the task's record is gone (expired) before its end was read
    ENDED_OTHERWISE = "o"


#: The settled outcomes the stop rule looks at.
SETTLED = frozenset({RunOutcome.COMPLETED, RunOutcome.FAILED_AGAIN,
                     RunOutcome.ENDED_OTHERWISE})


def run_outcome(state: str | None, attempt: str | int | None,
                claimed_attempt: int | None = None) -> tuple[RunOutcome | None, str]:
    """THE settle rule: a resubmitted task's outcome from its record now (``None``: not
    known yet), and a note. Completed -> completed; failed, dropped, stalled or cancelled
    (:data:`FAILED_AGAIN`) -> failed again; the record gone -> ended otherwise.

    ``claimed_attempt``: the attempt a claim took, given when the pass that claimed it never
    said whether it published (a worker restart): still dead at that attempt -> publish
    failed (never published; the entry stays dead), else published after all."""
    text = str(attempt) if attempt is not None else ""
    if state is None or not text.isdigit():
        return RunOutcome.ENDED_OTHERWISE, "the task's record is gone"
    task_state = TaskState(state)
    if claimed_attempt is not None and task_state in RESUBMITTABLE \
            and int(text) == claimed_attempt:
        return RunOutcome.PUBLISH_FAILED, (
            "claimed by a scheduler pass that did not finish publishing it (a worker "
            "restart?); not published, the entry stays dead")
    if task_state is TaskState.COMPLETED:
        return RunOutcome.COMPLETED, ""
    if task_state in FAILED_AGAIN:
        return RunOutcome.FAILED_AGAIN, ""
    # on its way; a stale claim that was published after all: no longer only claimed
    return (RunOutcome.PUBLISHED, "") if claimed_attempt is not None else (None, "")


def halt_reason(failed: int, last: int, halt_after: int, of_last: int) -> str:
    """Why a run halted (``run_settle.lua`` writes the same words)."""
    return (f"{failed} of the last {last} resubmitted tasks failed again (the rule: halt "
            f"when more than {halt_after} of the last {of_last})")


def stop_rule(last: Iterable[RunOutcome | str], halt_after: int | None,
              of_last: int | None) -> str:
    """Why the run must halt, or ``""``: more than ``halt_after`` of ``last`` (its newest
    ``of_last`` settled outcomes, newest first) failed again."""
    if halt_after is None or of_last is None:
        return ""
    window = [o for o in last if o in SETTLED][:of_last]
    failed = sum(1 for o in window if o == RunOutcome.FAILED_AGAIN)
    return halt_reason(failed, len(window), halt_after, of_last) if failed > halt_after else ""


@dataclass(frozen=True)
class ResubmitPace:
    """A rate (tasks per second, ``0.1 <= rate <= 500``) and an optional stop rule: halt
    when more than ``halt_after`` of the last ``of_last`` settled tasks failed again
    (``0 <= halt_after <= of_last <= 1000``). Bad values raise ``ValueError`` naming the
    field (``.field``). The slowest pace bounds a run's length: the largest run
    (``MAX_RUN_ENTRIES``) is published within ``MAX_RUN_SECONDS``."""

    #: The bounds, for front ends that state them (``MAX_RATE``, ``MIN_RATE``,
    #: ``MAX_WINDOW``, ``MAX_RUN_ENTRIES``, ``MAX_RUN_SECONDS``).
    max_rate: ClassVar[float] = MAX_RATE
    min_rate: ClassVar[float] = MIN_RATE
    max_window: ClassVar[int] = MAX_WINDOW
    max_run_entries: ClassVar[int] = MAX_RUN_ENTRIES
    max_run_seconds: ClassVar[float] = MAX_RUN_SECONDS
    #: What a refused rate is told (``RATE_MESSAGE``).
    rate_message: ClassVar[str] = RATE_MESSAGE

    rate: float
    halt_after: int | None = None
    of_last: int | None = None

    def __post_init__(self) -> None:
        rate = self.rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) \
                or not math.isfinite(rate) or not MIN_RATE <= rate <= MAX_RATE:
            raise PaceError("rate", RATE_MESSAGE)
        if (self.halt_after is None) != (self.of_last is None):
            name = "halt_after" if self.halt_after is None else "of_last"
            raise PaceError(name, "give halt_after and of_last together (the stop rule), "
                            "or neither")
        if self.of_last is not None and self.halt_after is not None:
            for name, value in (("of_last", self.of_last), ("halt_after", self.halt_after)):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise PaceError(name, "must be a whole number")
            if not 1 <= self.of_last <= MAX_WINDOW:
                raise PaceError("of_last", f"must be between 1 and {MAX_WINDOW}")
            if not 0 <= self.halt_after <= self.of_last:
                raise PaceError("halt_after", f"must be between 0 and of_last ({self.of_last})")

    @property
    def rule(self) -> str:
        return rule_text(self.halt_after, self.of_last)

    @staticmethod
    def allowance(rate: float, elapsed_s: float) -> int:
        """Members a pace lets go ``elapsed_s`` seconds after a run (re)started: one at
        once, then ``rate`` per second (``run_claim.lua`` and the Django sink's runs count
        so)."""
        return math.floor(rate * max(0.0, elapsed_s)) + 1


allowance = ResubmitPace.allowance


class PaceError(ValueError):
    """A pace or stop rule out of bounds; ``field`` names the parameter."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def rule_text(halt_after: int | None, of_last: int | None) -> str:
    if halt_after is None or of_last is None:
        return "no stop rule"
    return f"halt when more than {halt_after} of the last {of_last} failed again"


@dataclass(frozen=True)
class ResubmitRunInfo:
    """A paced resubmit and its progress, as read now. ``published``: claimed and handed
    to the broker (claimed less skipped and publish failed); ``remaining``: not claimed
    yet (a halted or cancelled run leaves them dead)."""

    id: int
    status: RunStatus
    rate: float
    halt_after: int | None
    of_last: int | None
    version: ResubmitVersion
    reset_retry_count: bool
    task_ids: list[str] | None
    filters: dict[str, Any] | None
    limit: int | None
    total: int
    published: int
    completed: int
    failed_again: int
    ended_otherwise: int
    skipped: int
    publish_failed: int
    remaining: int
    in_flight: int
    halt_reason: str
    source: str
    username: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_step_at: datetime | None
    events: list[dict[str, Any]]
    #: ``task_id:attempt`` -> why that entry was skipped or not published
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def rule(self) -> str:
        return rule_text(self.halt_after, self.of_last)

    @property
    def active(self) -> bool:
        return self.status not in FINAL

    def to_json(self) -> dict[str, Any]:
        """The shape of the Django sink's runs (``jobbers_dlq run --json``), plus
        ``ended_otherwise``, ``publish_failed``, ``in_flight``, ``events`` and ``notes``."""
        iso = iso_time  # the one JSON time format, as the REST API writes the same runs
        return {
            "id": self.id, "status": self.status.value, "rate": self.rate,
            "halt_after": self.halt_after, "of_last": self.of_last, "rule": self.rule,
            "version": self.version.value, "reset_retry_count": self.reset_retry_count,
            "task_ids": self.task_ids, "filters": self.filters, "limit": self.limit,
            "total": self.total, "published": self.published, "completed": self.completed,
            "failed_again": self.failed_again, "ended_otherwise": self.ended_otherwise,
            "skipped": self.skipped, "publish_failed": self.publish_failed,
            "remaining": self.remaining, "in_flight": self.in_flight,
            "halt_reason": self.halt_reason, "username": self.username,
            "source": self.source, "created_at": iso(self.created_at),
            "started_at": iso(self.started_at), "finished_at": iso(self.finished_at),
            "last_step_at": iso(self.last_step_at),
            "events": [{**e, "at": iso(when(e.get("at")))} for e in self.events],
            "notes": self.notes,
        }


def when(ms: object) -> datetime | None:
    """A Redis time in ms (as a run keeps it) as an aware UTC datetime; ``None`` if unset."""
    if ms in (None, ""):
        return None
    return datetime.fromtimestamp(int(str(ms)) / 1000.0, tz=UTC)
