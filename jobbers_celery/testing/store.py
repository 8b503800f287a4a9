"""InMemoryStore: the store's steps, heartbeats, cancellation, reads and publish leases in
dicts, for tests that must not need a Redis server.

Why it can be trusted: the rule of what may follow what is not copied here. Every step asks
:func:`jobbers_celery.core.states.allowed_from` (the table the Lua scripts are handed too),
so an illegal transition is refused here exactly as in Redis (``StepResult.applied`` false,
``why`` ``"state"``). The records are kept as the same flat fields Redis keeps, and read
back through the real store's parsers, so a :class:`~jobbers_celery.TaskRecord` and its
history look the same whichever store made them.

What it leaves out, on purpose: expiry after the retention period, shards, concurrency
leases across processes and the liveness of other workers (a take-back always finds the
giver gone). The Lua guards for those keep their real-Redis tests.
"""

from __future__ import annotations

import importlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jobbers_celery.core.records import TaskRecord, Transition
from jobbers_celery.core.states import TERMINAL, TaskState, allowed_from
from jobbers_celery.store import (
    CancelOutcome,
    Claimed,
    Giver,
    Heartbeat,
    RedisStore,
    ResultWrite,
    StepResult,
)
from jobbers_celery.testing.idle import IdleHousekeeping

__all__ = ["HeartbeatSent", "InMemoryStore"]


def _parser(name: str) -> Callable[..., Any]:
    """The real store's parser of a record's fields (``_record``, ``_history``): a module
    function of ``store/reads.py`` once the store is cut into parts, a static method of
    ``RedisStore`` before. Read from the store, never written twice."""
    try:
        reads: Any = importlib.import_module("jobbers_celery.store.reads")
        return getattr(reads, name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        return getattr(RedisStore, name)  # type: ignore[no-any-return]


def _record(task_id: str, raw: dict[str, str]) -> TaskRecord:
    record: TaskRecord = _parser("_record")(task_id, raw)
    return record


def _history(task_id: str, raw: dict[str, str]) -> list[Transition]:
    history: list[Transition] = _parser("_history")(task_id, raw)
    return history

S = TaskState
_CLAIM_RETURNS = ("msg", "retries", "name", "queue")


@dataclass(frozen=True, slots=True)
class HeartbeatSent:
    """One heartbeat that reached the store (``progress`` and ``checkpoint`` as the JSON
    text the task sent): what a test asserts on when it checks what a task reported."""

    task_id: str
    attempt: int
    progress: str | None
    checkpoint: str | None


class InMemoryStore(IdleHousekeeping):
    """The store a JobbersTask, the recorder, the publisher and the scheduler use, in
    memory. Thread-safe (one lock: each step is atomic, as a Lua script is).

    ``advance(seconds)`` moves its clock forward, for delays and run_at without sleeping.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()
        self._records: dict[str, dict[str, str]] = {}
        self._publishing: dict[str, int] = {}  # id -> publish lease deadline (ms)
        self._locks: dict[str, int] = {}
        self._leases: dict[str, tuple[str, int]] = {}
        self._offset_ms = 0
        self._epoch = uuid.uuid4().hex
        self._refused: Counter[str] = Counter()
        #: Every heartbeat the store accepted, oldest first.
        self.heartbeats: list[HeartbeatSent] = []

    # ------------------------------------------------------------------ clock
    def now_ms(self) -> int:
        return int(time.time() * 1000) + self._offset_ms

    def advance(self, seconds: float) -> None:
        """Move the store's clock ``seconds`` forward (a countdown comes due at once)."""
        with self._lock:
            self._offset_ms += int(seconds * 1000)

    def try_lock(self, name: str, ttl_ms: int) -> bool:
        with self._lock:
            now = self.now_ms()
            if self._locks.get(name, 0) > now:
                return False
            self._locks[name] = now + ttl_ms
            return True

    def hold_lease(self, key: str, token: str, ttl_ms: int) -> bool:
        with self._lock:
            now = self.now_ms()
            holder = self._leases.get(key)
            if holder is not None and holder[0] != token and holder[1] > now:
                return False
            self._leases[key] = (token, now + ttl_ms)
            return True

    def epoch(self, task_id: str, max_age: float = 0.0) -> str:
        return self._epoch

    # ------------------------------------------------------------------ steps
    def submit(self, task_id: str, *, sources: Iterable[TaskState], reason: str,
               name: str | None = None, create: dict[str, str] | None = None,
               fields: dict[str, str] | None = None, delete: Sequence[str] = (),
               lease_ms: int | None = None, ret: Sequence[str] = (),
               later: tuple[int, str] | None = None) -> StepResult:
        return self.step(task_id, S.SUBMITTED, sources=sources, create=create,
                         set_fields=fields, delete=delete, lease_ms=lease_ms, reason=reason,
                         ret=ret, name=name, later=later)

    def start(self, task_id: str, *, name: str, worker: str | None, wid: str,
              heartbeat_ms: int | None, cap: int | None, lease_cap_ms: int, defer_ms: int,
              fields: dict[str, str]) -> StepResult:
        return self.step(task_id, S.STARTED, set_fields=fields, start=True, wid=wid,
                         heartbeat_ms=heartbeat_ms, cap=cap, lease_cap_ms=lease_cap_ms,
                         defer_ms=defer_ms, cancellable=True, worker=worker,
                         ret=("ckpt", "queue"), name=name)

    def complete(self, task_id: str, fence: int, *, name: str, worker: str | None, wid: str,
                 fields: dict[str, str], delete: Sequence[str],
                 write_result: ResultWrite | None) -> StepResult:
        # write_result is not done here (result_written stays false): Celery writes it
        return self.step(task_id, S.COMPLETED, sources=(S.STARTED,), fence=fence,
                         set_fields=fields, delete=delete, worker=worker, wid=wid, name=name)

    def end(self, task_id: str, to: TaskState, *, fence: int | None = None,
            wid_fence: str | None = None, wid: str, name: str, worker: str | None,
            reason: str, fields: dict[str, str] | None = None, ret: Sequence[str] = (),
            cancellable: bool = False, cancel_reason: str | None = None,
            delay_ms: int | None = None, lease_ms: int | None = None,
            expect_refusal: bool = False, giver: Giver | None = None) -> StepResult:
        return self.step(task_id, to, sources=(S.STARTED,), fence=fence, wid_fence=wid_fence,
                         set_fields=fields, wid=wid, cancellable=cancellable,
                         cancel_reason=cancel_reason, delay_ms=delay_ms, lease_ms=lease_ms,
                         worker=worker, reason=reason, ret=ret, name=name, giver=giver)

    def unstarted(self, task_id: str, to: TaskState, *, reason: str,
                  worker: str | None = None, fields: dict[str, str] | None = None,
                  ret: Sequence[str] = ()) -> StepResult:
        return self.step(task_id, to, sources=(S.SUBMITTED,), set_fields=fields,
                         bump=to is S.DROPPED, worker=worker, reason=reason, ret=ret)

    def step(self, task_id: str, to: TaskState, *, sources: Iterable[TaskState] | None = None,
             fence: int | None = None, wid_fence: str | None = None,
             create: dict[str, str] | None = None, set_fields: dict[str, str] | None = None,
             delete: Sequence[str] = (), start: bool = False, bump: bool = False,
             wid: str | None = None, heartbeat_ms: int | None = None, cap: int | None = None,
             lease_cap_ms: int = 60_000, defer_ms: int = 1000, cancellable: bool = False,
             cancel_reason: str | None = None, delay_ms: int | None = None,
             lease_ms: int | None = None, worker: str | None = None,
             reason: str | None = None, ret: Sequence[str] = (), name: str | None = None,
             write_result: ResultWrite | None = None, expect_refusal: bool = False,
             later: tuple[int, str] | None = None, giver: Giver | None = None,
             gone_fence: bool = False) -> StepResult:
        """One step, atomically, as ``transition.lua`` applies it (see
        :meth:`RedisStore.step <jobbers_celery.store.RedisStore.step>`)."""
        table = allowed_from(to)
        src = table if sources is None else frozenset(sources)
        if not src <= table:
            raise ValueError(f"{sorted(src - table)} -> {to} is not in the transition table")
        with self._lock:
            now = self.now_ms()
            rec = self._records.get(task_id)
            exists = rec is not None
            cur = S(rec["state"]) if rec is not None else S.UNSUBMITTED
            attempt = int(rec.get("attempt") or 0) if rec is not None else 0

            def refuse(why: str) -> StepResult:
                self._refused[f"{cur}>{to}"] += 1
                return StepResult(applied=False, previous=cur.value if exists else "missing",
                                  now_ms=now, attempt=attempt, why=why)

            if cur not in src:
                return refuse("state")
            if rec is None and create is None:
                return refuse("missing")
            if fence is not None and fence != attempt:
                return refuse("stale_attempt")
            if wid_fence is not None and (rec or {}).get("wid") != wid_fence:
                return refuse("other_worker")
            if gone_fence and (rec or {}).get("gone") != str(attempt):
                return refuse("not_given_back")
            out = self._apply(task_id, rec, cur, to, now, attempt, create=create,
                              set_fields=set_fields, delete=delete, start=start, bump=bump,
                              wid=wid, heartbeat_ms=heartbeat_ms, cap=cap, defer_ms=defer_ms,
                              cancellable=cancellable, cancel_reason=cancel_reason,
                              delay_ms=delay_ms, worker=worker, reason=reason, ret=ret,
                              name=name)
            if lease_ms is not None:
                self._publishing[task_id] = now + lease_ms
            if later is not None and out.state is S.SUBMITTED:
                again = self.step(task_id, S.SCHEDULED, sources=(S.SUBMITTED,),
                                  delay_ms=later[0], reason=later[1])
                if again.applied:
                    out = StepResult(True, out.previous, now, out.attempt, S.SCHEDULED,
                                     out.values)
            if create is not None:
                out = StepResult(True, out.previous, now, out.attempt, out.state, out.values,
                                 epoch=self._epoch)
            return out

    def _apply(self, task_id: str, rec: dict[str, str] | None, cur: TaskState,
               to: TaskState, now: int, attempt: int, *, create: dict[str, str] | None,
               set_fields: dict[str, str] | None, delete: Sequence[str], start: bool,
               bump: bool, wid: str | None, heartbeat_ms: int | None, cap: int | None,
               defer_ms: int, cancellable: bool, cancel_reason: str | None,
               delay_ms: int | None, worker: str | None, reason: str | None,
               ret: Sequence[str], name: str | None) -> StepResult:
        """The writes of an allowed step (``step()`` in ``_lib.lua``, in the same order)."""
        asked = to
        before = dict(rec or {})
        if cancellable and before.get("cancel"):
            to, start = S.CANCELLED, False
            reason = cancel_reason or ("cancellation requested"
                                       + (f"; {reason}" if reason else ""))
        elif start and cap and not before.get("cap") and self._running(name or "") >= cap:
            to, start, delay_ms = S.SCHEDULED, False, defer_ms
            reason = f"max_concurrent={cap} reached: deferred, no retry used"
        if to is S.CANCELLED and before.get("cancel") and before.get("cxl"):
            reason = f"{before['cxl']}; {reason or 'cancelled'}"
        w: dict[str, str] = {"state": to.value}
        d: list[str] = []
        if rec is None:
            create = dict(create or {})
            attempt = int(create.pop("attempt", "0") or 0)
            w.update(create)
            w.update(attempt=str(attempt), sub_at=str(now))
        if bump and not start:
            attempt += 1
            w["attempt"] = str(attempt)
        if start:
            attempt += 1
            w.update(attempt=str(attempt), hb_at=str(now))
            w["retry_at" if before.get("start_at") else "start_at"] = str(now)
            if worker:
                w["worker"] = worker
            if wid:
                w["wid"] = wid
            if heartbeat_ms:
                w["hb_iv"] = str(heartbeat_ms)
            if cap:
                w["cap"] = str(cap)
            w.update(set_fields or {})
        elif set_fields and to is asked:
            w.update(set_fields)
        if to is asked:
            d += delete
        if cur is S.STARTED and to is not S.STARTED and before.get("cap") and not start:
            d.append("cap")
        if to is S.SCHEDULED:
            w["run_at"] = str(now + int(delay_ms or 0))
        elif cur is S.SCHEDULED:
            d.append("run_at")
        if to in TERMINAL:
            w["done_at"] = str(now)
            if before.get("cancel"):
                d += ["cancel", "cxl"]
        elif cur in TERMINAL:
            d.append("done_at")
        n = int(before.get("hn") or 0) + 1
        sub_at = int(w.get("sub_at") or before.get("sub_at") or now)
        w[f"h{n}"] = f"{to.value}|{now - sub_at}|{attempt}|{worker or ''}|{reason or ''}"
        w["hn"] = str(n)
        record = {**before, **w}
        for f in d:
            record.pop(f, None)
        self._records[task_id] = record
        values = {r: ("" if r in d and r not in w else w.get(r, before.get(r, "")))
                  for r in ret}
        return StepResult(applied=True, previous=cur.value if rec is not None else "missing",
                          now_ms=now, attempt=attempt, state=to, values=values)

    def _running(self, name: str) -> int:
        return sum(1 for r in self._records.values()
                   if r.get("name") == name and r.get("state") == "started" and r.get("cap"))

    def cancel(self, task_id: str, reason: str, terminate_ms: int | None = None,
               set_fields: dict[str, str] | None = None,
               keep_reason: bool = False) -> CancelOutcome:
        """As ``cancel.lua``: a waiting task is cancelled at once, a started one flagged
        (its next heartbeat says so, its next step ends it cancelled)."""
        with self._lock:
            rec = self._records.get(task_id)
            state = rec.get("state") if rec is not None else None
            if rec is not None and state in ("submitted", "scheduled"):
                done = self.step(task_id, S.CANCELLED, sources=(S.SCHEDULED, S.SUBMITTED),
                                 reason=reason, set_fields=set_fields)
                if done.applied:
                    return CancelOutcome("cancelled", str(state))
            elif rec is not None and state in ("started", "unsubmitted"):
                if keep_reason and not rec.get("cancel"):
                    rec["cxl"] = reason
                rec["cancel"] = str(self.now_ms())
                return CancelOutcome("requested", str(state))
            return CancelOutcome("no", str(state or "missing"))

    # ------------------------------------------------------------------ running tasks
    def heartbeat(self, task_id: str, fence: int, *, progress: str | None = None,
                  checkpoint: str | None = None, name: str | None = None,
                  lease_cap_ms: int | None = None) -> Heartbeat:
        """As ``heartbeat.lua``: accepted only while attempt ``fence`` is the started one."""
        with self._lock:
            now = self.now_ms()
            rec = self._records.get(task_id) or {}
            attempt = int(rec.get("attempt") or 0)
            if rec.get("state") != "started" or attempt != fence:
                self._refused["rejected:heartbeat"] += 1
                return Heartbeat(accepted=False, cancel_requested=False, now_ms=now,
                                 state=rec.get("state", "missing"), attempt=attempt)
            rec["hb_at"] = str(now)
            if progress is not None:
                rec["progress"] = progress
            if checkpoint is not None:
                rec["ckpt"] = checkpoint
            self.heartbeats.append(HeartbeatSent(task_id, fence, progress, checkpoint))
            return Heartbeat(accepted=True, cancel_requested=bool(rec.get("cancel")),
                             now_ms=now)

    # ------------------------------------------------------------------ reads
    def get(self, task_id: str) -> TaskRecord | None:
        raw = self.get_raw(task_id)
        return _record(task_id, raw) if raw else None

    def get_raw(self, task_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._records.get(task_id) or {})

    def history(self, task_id: str) -> list[Transition]:
        return _history(task_id, self.get_raw(task_id))

    def started_by(self, task_id: str, wid: str) -> StepResult | None:
        raw = self.get_raw(task_id)
        if raw.get("state") != "started" or raw.get("wid") != wid:
            return None
        return StepResult(applied=True, previous="submitted", now_ms=int(raw.get("hb_at") or 0),
                          attempt=int(raw.get("attempt") or 0), state=S.STARTED,
                          values={"ckpt": raw.get("ckpt", ""), "queue": raw.get("queue", "")})

    def fields(self, ids: Sequence[str], names: Sequence[str]) -> list[list[str | None]]:
        with self._lock:
            return [[(self._records.get(i) or {}).get(n) for n in names] for i in ids]

    def counts(self) -> dict[TaskState, int]:
        with self._lock:
            found = Counter(r["state"] for r in self._records.values())
        return {s: found.get(s.value, 0) for s in TaskState}

    def tasks(self, state: TaskState | None = None, name: str | None = None,
              queue: str | None = None, limit: int = 100,
              worker: str | None = None) -> list[TaskRecord]:
        """Newest submitted first, as the store's indexes list them."""
        with self._lock:
            rows = sorted(self._records.items(), key=lambda kv: -int(kv[1].get("sub_at") or 0))
        picked = [_record(i, r) for i, r in rows
                  if (state is None or r.get("state") == state.value)
                  and (name is None or r.get("name") == name)
                  and (queue is None or r.get("queue") == queue)
                  and (worker is None or r.get("worker") == worker)]
        return picked[:limit]

    def scheduled(self, limit: int = 100) -> list[TaskRecord]:
        """Waiting for their run_at, soonest first."""
        with self._lock:
            rows = sorted((int(r.get("run_at") or 0), i, dict(r))
                          for i, r in self._records.items() if r.get("state") == "scheduled")
        return [_record(i, r) for _, i, r in rows[:limit]]

    def refused_counts(self) -> dict[str, int]:
        """How many steps were refused, per ``from>to`` (and refused heartbeats)."""
        with self._lock:
            return dict(self._refused)

    # ------------------------------------------------------------------ scheduling
    def due(self, limit: int = 500) -> tuple[list[str], int | None]:
        """The scheduled tasks whose run_at came and the publishes whose lease lapsed; the
        next run_at still to come (``None``: none)."""
        with self._lock:
            now = self.now_ms()
            runs = sorted((int(r["run_at"]), i) for i, r in self._records.items()
                          if r.get("state") == "scheduled" and r.get("run_at"))
            lapsed = [i for i, at in self._publishing.items() if at <= now]
        ids = [i for at, i in runs if at <= now][:limit] + lapsed[:limit]
        later = [at for at, _ in runs if at > now]
        return list(dict.fromkeys(ids)), (later[0] if later else None)

    def claim(self, ids: Sequence[str], lease_ms: int, worker: str | None) -> list[Claimed]:
        """As ``claim.lua``: each due id at most once, whoever else claims."""
        out: list[Claimed] = []
        with self._lock:
            now = self.now_ms()
            for task_id in ids:
                rec = self._records.get(task_id) or {}
                state, run_at = rec.get("state"), rec.get("run_at")
                if state == "scheduled" and run_at and int(run_at) <= now:
                    res = self.step(task_id, S.SUBMITTED, sources=(S.SCHEDULED,),
                                    lease_ms=lease_ms, worker=worker, reason="run_at reached",
                                    ret=_CLAIM_RETURNS)
                    if res.applied:
                        out.append(self._claimed(task_id, res.values, int(run_at)))
                    continue
                deadline = self._publishing.get(task_id)
                if deadline is None or deadline > now:
                    continue
                if state == "submitted":
                    self._publishing[task_id] = now + lease_ms
                    out.append(self._claimed(task_id, rec, None))
                elif state == "unsubmitted":
                    res = self.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                                    lease_ms=lease_ms, worker=worker, ret=_CLAIM_RETURNS,
                                    reason="published by a scheduler: its publisher did not")
                    if res.applied:
                        out.append(self._claimed(task_id, res.values, None))
                else:
                    self._publishing.pop(task_id, None)
        return out

    @staticmethod
    def _claimed(task_id: str, values: dict[str, str], run_at: int | None) -> Claimed:
        return Claimed(task_id, values.get("msg", ""), int(values.get("retries") or 0),
                       values.get("name", ""), run_at, values.get("queue", ""))

    def release_publish_leases(self, ids: Sequence[str]) -> None:
        with self._lock:
            for i in ids:
                if i in self._publishing:
                    self._publishing[i] = 0

    def confirm_published(self, ids: Iterable[str]) -> None:
        with self._lock:
            for i in ids:
                self._publishing.pop(i, None)

    def publishing(self) -> dict[str, int]:
        """The publish leases not yet confirmed (id: deadline ms): what a crashed publisher
        would leave for a scheduler to publish again."""
        with self._lock:
            return dict(self._publishing)
