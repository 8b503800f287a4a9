"""Paced resubmits from the Redis dead-letter sink: publish a selection of dead letters at a
rate, and halt when too many of them fail again, so that an unfixed cause is not hammered by
a thousand tasks at once. (The values, and the settle rule both sinks go by, are in
:mod:`jobbers_celery.resubmit.pace`.)

A run lives in Redis (keys in :mod:`jobbers_celery.store.keys`, ``run:<id>``...): a hash
(selection, pace, rule, version choice, status, counters, halt reason, times), the list of
its pending members (``task_id:attempt``), the claimed ones whose outcome is not known yet,
and the outcomes of the last settled ones (the stop rule's window). Every worker's scheduler
pass drives the active runs (:class:`Pacer`, bounded work per pass), so a run goes on
whatever worker restarts, and:

1. settles claimed members from their tasks' records (:func:`~.pace.run_outcome`: a newer
   attempt that completed -> completed; failed, dropped, stalled or cancelled (or
   dead-lettered again) -> failed again; the record gone -> ended otherwise); and applies
   the stop rule ("more than X of the last N settled failed again" -> halted, with why) and
   sees whether the run is done (one script);
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
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from jobbers_celery.core.errors import ResubmitRunConflict
from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.states import RESUBMITTABLE
from jobbers_celery.deadletter.errors import describe_error
from jobbers_celery.resubmit.claimed import Publish, publish_claimed
from jobbers_celery.resubmit.pace import (
    MAX_RUN_ENTRIES,
    MAX_RUN_SECONDS,
    MAX_WINDOW,
    PaceError,
    ResubmitPace,
    ResubmitRunInfo,
    RunOutcome,
    RunStatus,
    run_outcome,
    when,
)
from jobbers_celery.store.parts import PacerStore, RunStore

__all__ = ["Pacer", "control", "read", "start"]

log = escaped_logger("jobbers.pacing")

#: Most members one pass claims, and settles, per run; most runs one pass drives.
MAX_BATCH = 500
MAX_SETTLE = 500
MAX_RUNS_PER_PASS = 20

Fate = tuple[str, str, str]  # member, RunOutcome code, note


def _opt_int(raw: str | None) -> int | None:
    return int(raw) if raw not in (None, "") else None


# ---------------------------------------------------------------------- control
def start(store: RunStore, entries: Sequence[DeadLetter], pace: ResubmitPace, *,
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


def read(store: RunStore, run_id: int) -> ResubmitRunInfo | None:
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
        created_at=when(f.get("created_at")) or datetime.fromtimestamp(0, tz=UTC),
        started_at=when(f.get("started_at")), finished_at=when(f.get("finished_at")),
        last_step_at=when(f.get("last_step_at")),
        events=[json.loads(e) for e in events],
        notes={member: _note(text) for member, text in notes.items()})


_NOTE_KINDS = {RunOutcome.SKIPPED.value: "skipped",
               RunOutcome.PUBLISH_FAILED.value: "publish failed"}


def _note(text: str) -> str:
    code, _, why = text.partition("|")
    return f"{_NOTE_KINDS.get(code, code)}: {why}"


def control(store: RunStore, run_id: int, action: str, by: str) -> None:
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


class Pacer:
    """What a scheduler pass does for paced resubmits (see the module docstring).

    ``entry`` reads a dead-letter entry back from the sink; ``publish`` is the resubmit
    path (``Jobbers.resubmit_dead_letters``), returning the task ids it published.
    ``claim_timeout_s``: after this long, a claimed member whose publish was never
    confirmed is settled from its record (the pass that claimed it died)."""

    def __init__(self, store: PacerStore, entry: EntryReader, publish: Publish,
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
        outcomes: list[Fate] = []
        if unsettled:
            now = store.now_ms()
            stale = {m for m, at in claiming.items() if now - at > self.claim_timeout_ms}
            look = [m for m in unsettled if m not in claiming or m in stale]
            rows = store.fields([_split(m)[0] for m in look], ("state", "attempt"))
            for member, (state, attempt) in zip(look, rows, strict=True):
                claimed = _split(member)[1] if member in stale else None
                code, note = run_outcome(state, attempt, claimed)
                if code is not None:
                    outcomes.append((member, code.value, note))
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
        fates: list[Fate] = []
        for member in members:
            task_id, attempt = _split(member)
            entry = self.entry(task_id, attempt)
            if entry is None:
                fates.append(_skipped(member, "its dead-letter entry is gone (discarded)"))
            elif (why := self.unopenable(entry)) is not None:
                note = f"not published by this worker: {why}; the entry stays dead"
                fates.append(_skipped(member, note))
            else:
                entries[member] = entry
        try:
            went = publish_claimed(entries, self.publish, reset_retry_count=reset,
                                   version=version,
                                   refused=lambda left: fates.extend(self._refused(
                                       {m: entries[m] for m in left})))
        except Exception as exc:
            log.exception("paced resubmit %s: publishing %d entries failed", run_id,
                          len(entries))
            # no argument value or credential in the note (as the dead-letter log lines)
            fates.extend(self._after_failure(entries, describe_error(exc, entries.values())))
        else:
            fates.extend((member, RunOutcome.PUBLISHED.value, "") for member in went)
        self.store.settle_run(run_id, fates, MAX_WINDOW)
        return sum(1 for _, code, _ in fates if code == RunOutcome.PUBLISHED)

    def _refused(self, refused: Mapping[str, DeadLetter]) -> list[Fate]:
        """Claimed members the resubmit path refused: skipped, with the task's state."""
        states = self.store.fields([e.task_id for e in refused.values()], ("state",))
        return [_skipped(member, f"not resubmittable: the task is {state or 'gone'}")
                for member, (state,) in zip(refused, states, strict=True)]

    def _after_failure(self, entries: Mapping[str, DeadLetter], error: str) -> list[Fate]:
        """The publish call raised part-way: a task whose resubmit step applied was (or,
        by its publish lease, will be) published; one still dead was not."""
        if not entries:
            return []
        rows = self.store.fields([e.task_id for e in entries.values()], ("state", "attempt"))
        fates = []
        for (member, entry), (state, attempt) in zip(entries.items(), rows, strict=True):
            still_dead = state in RESUBMITTABLE and attempt == str(entry.attempt)
            fates.append((member, RunOutcome.PUBLISH_FAILED.value,
                          f"{error}; the entry stays dead")
                         if still_dead else (member, RunOutcome.PUBLISHED.value, ""))
        return fates


def _skipped(member: str, note: str) -> Fate:
    return member, RunOutcome.SKIPPED.value, note


def _split(member: str) -> tuple[str, int]:
    task_id, _, attempt = member.rpartition(":")
    return task_id, int(attempt)
