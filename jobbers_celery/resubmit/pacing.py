"""Paced resubmits from the Redis dead-letter sink: publish a selection of dead letters at a
rate, and halt when too many of them fail again, so that an unfixed cause is not hammered by
a thousand tasks at once.

A run lives in Redis (keys in :mod:`jobbers_celery.store.keys`, ``run:<id>``...): a hash
(selection, pace, rule, version choice, status, counters, halt reason, times), the list of
its pending members (``task_id:attempt``), the claimed ones whose outcome is not known yet,
and the outcomes of the last settled ones (the stop rule's window). Every worker's scheduler
pass drives the active runs (:class:`Pacer`, bounded work per pass), so a run goes on
whatever worker restarts, and:

1. settles claimed members from their tasks' records: a newer attempt that completed ->
   completed; failed, dropped, stalled or cancelled (or dead-lettered again) -> failed again;
   the record gone -> ended otherwise; and applies the stop rule ("more than X of the last N
   settled failed again" -> halted, with why) and sees whether the run is done (one script);
2. claims what the pace allows (``run_claim.lua``: a member leaves the pending list in the
   same step that claims it, so it is handed out once per run, whatever races);
3. publishes the claimed members through :meth:`Jobbers.resubmit_dead_letters` (the
   compare-and-set resubmit path) and records each one's fate: published, skipped (the task
   was not resubmittable: someone else resubmitted it, or it cannot be published), or
   publish failed. A member claimed by a pass that died before saying (a worker restart) is
   settled from its record after ``publish_lease`` seconds: never published again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from jobbers_celery.core.errors import ResubmitRunConflict
from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.states import RESUBMITTABLE, TaskState
from jobbers_celery.deadletter.errors import describe_error
from jobbers_celery.store import RedisStore

__all__ = [
    "MAX_RATE",
    "MAX_RUN_ENTRIES",
    "MAX_RUN_SECONDS",
    "MAX_WINDOW",
    "MIN_RATE",
    "RATE_MESSAGE",
    "PaceError",
    "Pacer",
    "ResubmitPace",
    "ResubmitRunInfo",
    "RunStatus",
    "allowance",
    "control",
    "read",
    "start",
]

log = escaped_logger("jobbers.pacing")

#: Fastest pace, tasks per second (as the Django sink's paced resubmits).
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
#: Most members one pass claims, and settles, per run; most runs one pass drives.
MAX_BATCH = 500
MAX_SETTLE = 500
MAX_RUNS_PER_PASS = 20

_FAILED_AGAIN = frozenset({TaskState.FAILED, TaskState.DROPPED, TaskState.STALLED,
                           TaskState.CANCELLED})


class RunStatus(StrEnum):
    """queued, running, paused; or, final: halted (by the stop rule), cancelled, done."""

    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"
    CANCELLED = "cancelled"
    DONE = "done"


FINAL = frozenset({RunStatus.HALTED, RunStatus.CANCELLED, RunStatus.DONE})


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
        def iso(at: datetime | None) -> str | None:
            return at.isoformat(timespec="milliseconds") if at else None

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
            "events": [{**e, "at": iso(_when(e.get("at")))} for e in self.events],
            "notes": self.notes,
        }


def _when(ms: object) -> datetime | None:
    if ms in (None, ""):
        return None
    return datetime.fromtimestamp(int(str(ms)) / 1000.0, tz=UTC)


def _opt_int(raw: str | None) -> int | None:
    return int(raw) if raw not in (None, "") else None


# ---------------------------------------------------------------------- control
def start(store: RedisStore, entries: Sequence[DeadLetter], pace: ResubmitPace, *,
          reset_retry_count: bool, version: ResubmitVersion,
          selection: Mapping[str, Any] | None, source: str, username: str) -> int:
    """Create a run of ``entries`` (one per task, first one kept, unpublishable ones left
    out) in the given order; the workers' scheduler passes drive it. Returns its id."""
    members: list[str] = []
    seen: set[str] = set()
    for entry in entries:
        if entry.task_id in seen or entry.unpublishable:
            continue
        seen.add(entry.task_id)
        members.append(f"{entry.task_id}:{entry.attempt}")
    if len(members) > MAX_RUN_ENTRIES:
        raise PaceError("entries", f"at most {MAX_RUN_ENTRIES:,} entries per run (the "
                        f"slowest pace publishes them within {MAX_RUN_SECONDS:,.0f} s); "
                        f"{len(members):,} given")
    chosen = dict(selection or {})
    fields = {
        "status": RunStatus.QUEUED.value, "rate": repr(float(pace.rate)),
        "halt_after": "" if pace.halt_after is None else str(pace.halt_after),
        "of_last": "" if pace.of_last is None else str(pace.of_last),
        "version": version.value, "reset": "1" if reset_retry_count else "0",
        "task_ids": json.dumps(chosen["task_ids"]) if chosen.get("task_ids") is not None
        else "",
        "filters": json.dumps(chosen["filters"]) if chosen.get("filters") is not None else "",
        "limit": str(chosen["limit"]) if chosen.get("limit") is not None else "",
        "total": str(len(members)), "claimed": "0", "source": source, "username": username,
        "halt_reason": "",
    }
    by = f"{source}:{username}" if username else source
    event = json.dumps({"at": store.now_ms(), "action": "start", "by": by,
                        "detail": f"{len(members)} entries at {pace.rate:g}/s; {pace.rule}"})
    run_id = store.create_run(fields, members, event)
    log.info("paced resubmit %s started by %s: %d entries at %g/s; %s", run_id, by,
             len(members), pace.rate, pace.rule)
    return run_id


def read(store: RedisStore, run_id: int) -> ResubmitRunInfo | None:
    """The run as it is now, ``None`` if there is none (or it expired)."""
    found = store.run(run_id)
    if found is None:
        return None
    f, pending, unsettled, events, notes = found
    counts = {name: int(f.get(name) or 0) for name in
              ("total", "claimed", "completed", "failed_again", "ended_otherwise", "skipped",
               "publish_failed")}
    return ResubmitRunInfo(
        id=run_id, status=RunStatus(f["status"]), rate=float(f["rate"]),
        halt_after=_opt_int(f.get("halt_after")), of_last=_opt_int(f.get("of_last")),
        version=ResubmitVersion(f.get("version") or ResubmitVersion.ENTRY.value),
        reset_retry_count=f.get("reset") != "0",
        task_ids=json.loads(f["task_ids"]) if f.get("task_ids") else None,
        filters=json.loads(f["filters"]) if f.get("filters") else None,
        limit=_opt_int(f.get("limit")), total=counts["total"],
        published=counts["claimed"] - counts["skipped"] - counts["publish_failed"],
        completed=counts["completed"], failed_again=counts["failed_again"],
        ended_otherwise=counts["ended_otherwise"], skipped=counts["skipped"],
        publish_failed=counts["publish_failed"], remaining=pending, in_flight=unsettled,
        halt_reason=f.get("halt_reason", ""), source=f.get("source", ""),
        username=f.get("username", ""),
        created_at=_when(f.get("created_at")) or datetime.fromtimestamp(0, tz=UTC),
        started_at=_when(f.get("started_at")), finished_at=_when(f.get("finished_at")),
        last_step_at=_when(f.get("last_step_at")),
        events=[json.loads(e) for e in events],
        notes={member: _note(text) for member, text in notes.items()})


def _note(text: str) -> str:
    code, _, why = text.partition("|")
    return f"{_NOTE_KINDS.get(code, code)}: {why}"


_NOTE_KINDS = {"s": "skipped", "x": "publish failed"}


def control(store: RedisStore, run_id: int, action: str, by: str) -> None:
    """Pause (publish nothing more; what was published is still followed), resume (at the
    pace counted from now) or cancel (the unpublished entries stay dead). Raises
    ``LookupError`` if there is no such run, :class:`ResubmitRunConflict` if its status does
    not allow ``action`` (of two operators pressing the same button, one moves the run)."""
    moved, status = store.control_run(run_id, action, by)
    if not status:
        raise LookupError(f"no paced resubmit {run_id}")
    if not moved:
        raise ResubmitRunConflict(run_id, action, status)
    log.info("paced resubmit %s: %s by %s", run_id, status, by)


# ---------------------------------------------------------------------- the driver
EntryReader = Callable[[str, int], DeadLetter | None]
Publish = Callable[[list[DeadLetter], bool, ResubmitVersion], list[str]]


class Pacer:
    """What a scheduler pass does for paced resubmits (see the module docstring).

    ``entry`` reads a dead-letter entry back from the sink; ``publish`` is the resubmit
    path (``Jobbers.resubmit_dead_letters``), returning the task ids it published.
    ``claim_timeout_s``: after this long, a claimed member whose publish was never
    confirmed is settled from its record (the pass that claimed it died)."""

    def __init__(self, store: RedisStore, entry: EntryReader, publish: Publish,
                 claim_timeout_s: float, exclusive_s: float = 0.0,
                 unopenable: Callable[[DeadLetter], str | None] = lambda _: None) -> None:
        self.store = store
        self.entry = entry
        self.publish = publish
        #: why this process cannot publish an entry's sealed arguments (None: it can)
        self.unopenable = unopenable
        self.claim_timeout_ms = int(claim_timeout_s * 1000)
        self.exclusive_ms = int(exclusive_s * 1000)

    def pass_once(self) -> int:
        """Drive every active run a step (at most ``MAX_RUNS_PER_PASS``); returns the
        members this pass published. With ``exclusive_s``, a run stepped by one worker is
        left alone by the others for that long (a lock that expires by itself: it saves
        duplicate reads, the scripts keep the counts exact without it)."""
        published = 0
        for run_id in self.store.active_runs(MAX_RUNS_PER_PASS):
            if self.exclusive_ms and not self.store.try_lock(f"run:{run_id}",
                                                              self.exclusive_ms):
                continue
            try:
                published += self.step(run_id)
            except Exception:
                log.exception("paced resubmit %s: this pass failed; the next one goes on",
                              run_id)
        return published

    def step(self, run_id: int) -> int:
        """Settle, then claim and publish what the pace allows. Returns published."""
        status = self.settle(run_id)
        if status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            return 0
        members = self.store.claim_run(run_id, MAX_BATCH)
        if not members:
            return 0
        return self._publish(run_id, members)

    def settle(self, run_id: int) -> str:
        """Read the outcomes of claimed members (bounded), record them, apply the rule."""
        store = self.store
        unsettled, claiming = store.run_unsettled(run_id, MAX_SETTLE)
        outcomes: list[tuple[str, str, str]] = []
        if unsettled:
            now = store.now_ms()
            stale = {m for m, at in claiming.items() if now - at > self.claim_timeout_ms}
            look = [m for m in unsettled if m not in claiming or m in stale]
            rows = store.fields([_task_id(m) for m in look], ("state", "attempt"))
            for member, (state, attempt) in zip(look, rows, strict=True):
                code, note = outcome(member, state, attempt, member in stale)
                if code:
                    outcomes.append((member, code, note))
        status, changed = store.settle_run(run_id, outcomes, MAX_WINDOW)
        if changed:
            if status == RunStatus.HALTED:
                log.warning("paced resubmit %s halted: %s", run_id, changed)
            else:
                log.info("paced resubmit %s %s: %s", run_id, status, changed)
        return status

    def _publish(self, run_id: int, members: list[str]) -> int:
        """Publish the claimed members; record each one's fate (never lost, never twice)."""
        reset_raw, version_raw = self.store.run_fields(run_id, ("reset", "version"))
        reset = reset_raw != "0"
        version = ResubmitVersion(version_raw or ResubmitVersion.ENTRY.value)
        entries: dict[str, DeadLetter] = {}
        fates: list[tuple[str, str, str]] = []
        for member in members:
            task_id, attempt = _split(member)
            entry = self.entry(task_id, attempt)
            if entry is None:
                fates.append((member, "s", "its dead-letter entry is gone (discarded)"))
            elif (why := self.unopenable(entry)) is not None:
                note = f"not published by this worker: {why}; the entry stays dead"
                fates.append((member, "s", note))
            else:
                entries[member] = entry
        try:
            done = set(self.publish(list(entries.values()), reset, version))
        except Exception as exc:
            log.exception("paced resubmit %s: publishing %d entries failed", run_id,
                          len(entries))
            # no argument value or credential in the note (as the dead-letter log lines)
            fates.extend(self._after_failure(entries, describe_error(exc, entries.values())))
        else:
            if entries:
                states = self.store.fields([e.task_id for e in entries.values()], ("state",))
            else:
                states = []
            for (member, entry), (state,) in zip(entries.items(), states, strict=True):
                if entry.task_id in done:
                    fates.append((member, "p", ""))
                else:
                    fates.append((member, "s", f"not resubmittable: the task is {state or 'gone'}"))
        self.store.settle_run(run_id, fates, MAX_WINDOW)
        return sum(1 for _, code, _ in fates if code == "p")

    def _after_failure(self, entries: Mapping[str, DeadLetter], error: str
                       ) -> list[tuple[str, str, str]]:
        """The publish call raised part-way: a task whose resubmit step applied was (or,
        by its publish lease, will be) published; one still dead was not."""
        if not entries:
            return []
        rows = self.store.fields([e.task_id for e in entries.values()], ("state", "attempt"))
        fates = []
        for (member, entry), (state, attempt) in zip(entries.items(), rows, strict=True):
            still_dead = state in RESUBMITTABLE and attempt == str(entry.attempt)
            fates.append((member, "x", f"{error}; the entry stays dead")
                         if still_dead else (member, "p", ""))
        return fates


def outcome(member: str, state: str | None, attempt: str | None, stale_claim: bool
            ) -> tuple[str, str]:
    """A claimed member's outcome code from its task's record (``""``: not known yet) and
    a note. ``stale_claim``: the pass that claimed it never said whether it published."""
    _, claimed_attempt = _split(member)
    if state is None or attempt in (None, "") or not attempt.isdigit():
        return "o", "the task's record is gone"
    now_attempt, task_state = int(attempt), TaskState(state)
    if stale_claim and task_state in RESUBMITTABLE and now_attempt == claimed_attempt:
        return "x", ("claimed by a scheduler pass that did not finish publishing it (a worker "
                     "restart?); not published, the entry stays dead")
    if task_state is TaskState.COMPLETED:
        return "c", ""
    if task_state in _FAILED_AGAIN:
        return "f", ""
    # on its way; a stale claim that was published after all: no longer only claimed
    return ("p", "") if stale_claim else ("", "")


def _split(member: str) -> tuple[str, int]:
    task_id, _, attempt = member.rpartition(":")
    return task_id, int(attempt)


def _task_id(member: str) -> str:
    return member.rpartition(":")[0]
