"""The lifecycle steps in memory (the ``StepStore`` part): submit, start, complete, end,
unstarted, any step, cancel, and the purge that removes or cancels records.

Why it can be trusted: the rule of what may follow what is not copied here. Every step asks
:func:`jobbers_celery.core.states.allowed_from` (the table the Lua scripts are handed too),
so an illegal transition is refused here exactly as in Redis (``StepResult.applied`` false,
``why`` ``"state"``); the writes follow ``step()`` in ``_lib.lua``, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.ratelimit import RateKey
from jobbers_celery.core.states import TERMINAL, TaskState, allowed_from
from jobbers_celery.core.unique import UniqueInfo
from jobbers_celery.core.workflow import WORKFLOW_CANCELLED
from jobbers_celery.store.base import (
    CancelOutcome,
    Giver,
    ResultWrite,
    SentSteps,
    StepResult,
    Submission,
)
from jobbers_celery.testing.ratelimits import MemoryRates
from jobbers_celery.testing.ratelimits import reason as rate_reason
from jobbers_celery.testing.series import MemorySeries
from jobbers_celery.testing.unique import MemoryLocks

__all__ = ["MemorySteps"]

S = TaskState


class MemorySteps(MemorySeries):
    """The steps of the in-memory store."""

    def submit(self, task_id: str, *, sources: Iterable[TaskState], reason: str,
               name: str | None = None, create: dict[str, str] | None = None,
               fields: dict[str, str] | None = None, delete: Sequence[str] = (),
               lease_ms: int | None = None, ret: Sequence[str] = (),
               later: tuple[int, str] | None = None, fair: FairKey | None = None,
               need: str | None = None) -> StepResult:
        """``fair``: parked by the store's fair part
        (:class:`~jobbers_celery.testing.fairshare.MemoryFairShares`, which extends this)."""
        return self.step(task_id, S.SUBMITTED, sources=sources, create=create,
                         set_fields=fields, delete=delete, lease_ms=lease_ms, reason=reason,
                         ret=ret, name=name, later=later, need=need)

    def submit_many(self, items: Sequence[Submission]) -> SentSteps:
        """Each item's ``submit`` at once (as Redis applies them on receipt), the results
        handed back when asked; a member under fair shares (``fair``) as a single
        publish's (the store's fair part parks it)."""
        results: list[StepResult | Exception] = []
        for item in items:
            try:
                results.append(self.submit(item.task_id, sources=item.sources,
                                           create=item.create, fields=item.fields,
                                           reason=item.reason, name=item.name,
                                           fair=item.fair))
            except Exception as exc:  # noqa: BLE001 - as the Redis store hands one back
                results.append(exc)
        return SentSteps(lambda: results)

    def start(self, task_id: str, *, name: str, worker: str | None, wid: str,
              heartbeat_ms: int | None, cap: int | None, lease_cap_ms: int, defer_ms: int,
              fields: dict[str, str], rate: RateKey | None = None) -> StepResult:
        with self._lock:  # the rate check and the step: one atomic unit, as one script
            rec = self._records.get(task_id) or {}
            waits = None
            if rate is not None and rec.get("state") == S.SUBMITTED and not rec.get("cancel") \
                    and not (cap and self._running(name) >= cap):
                waits = self.rates.wait(name, rate, task_id, self.now_ms())
            if rate is not None and waits is not None:
                return self.step(task_id, S.SCHEDULED, sources=(S.SUBMITTED,),
                                 delay_ms=waits[0], worker=worker, ret=("ckpt", "queue"),
                                 reason=rate_reason(waits[1], rate.digest, waits[0]))
            res = self.step(task_id, S.STARTED, set_fields=fields, start=True, wid=wid,
                            heartbeat_ms=heartbeat_ms, cap=cap, lease_cap_ms=lease_cap_ms,
                            defer_ms=defer_ms, cancellable=True, worker=worker,
                            ret=("ckpt", "queue"), name=name)
            if rate is not None and res.state is S.STARTED:
                self.rates.take(name, rate, res.now_ms)
            return res

    @property
    def rates(self) -> MemoryRates:
        """The rate limits' windows and overrides (made at first use)."""
        rates = self.__dict__.get("_rates")
        if rates is None:
            rates = self.__dict__["_rates"] = MemoryRates()
        return rates

    def rate_overrides(self) -> dict[str, str]:
        with self._lock:
            return dict(self.rates.overrides)

    def set_rate_override(self, name: str, text: str) -> str:
        with self._lock:
            return self.rates.set_override(name, text)

    def clear_rate_override(self, name: str) -> bool:
        with self._lock:
            return self.rates.overrides.pop(name, None) is not None

    def rate_held(self, names: Iterable[str]) -> dict[str, int]:
        with self._lock:
            return self.rates.held(names, self.now_ms())

    def complete(self, task_id: str, fence: int, *, name: str, worker: str | None, wid: str,
                 fields: dict[str, str], delete: Sequence[str],
                 write_result: ResultWrite | None, reason: str | None = None) -> StepResult:
        # write_result is not done here (result_written stays false): Celery writes it
        return self.step(task_id, S.COMPLETED, sources=(S.STARTED,), fence=fence,
                         set_fields=fields, delete=delete, worker=worker, wid=wid, name=name,
                         reason=reason)

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
             gone_fence: bool = False, need: str | None = None) -> StepResult:
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
            if need is not None and need not in ret:
                raise ValueError("need: a field of ret")
            if need is not None and (rec or {}).get(need) is None:
                return StepResult(applied=False, previous=cur.value if exists else "missing",
                                  now_ms=now, attempt=attempt, why=f"no_{need}")
            held = self.unique_locks.take(self._records, task_id, rec, cur, to, create, now)
            if held is not None:  # a unique task's copy holds the lock (testing/unique.py)
                return StepResult(applied=False, previous=cur.value if exists else "missing",
                                  now_ms=now, attempt=attempt, why=f"duplicate:{held}")
            out = self._apply(task_id, rec, cur, to, now, attempt, create=create,
                              set_fields=set_fields, delete=delete, start=start, bump=bump,
                              wid=wid, heartbeat_ms=heartbeat_ms, cap=cap, defer_ms=defer_ms,
                              cancellable=cancellable, cancel_reason=cancel_reason,
                              delay_ms=delay_ms, worker=worker, reason=reason, ret=ret,
                              name=name)
            self.unique_locks.release(task_id, self._records.get(task_id))
            if lease_ms is not None:
                self._publishing[task_id] = now + lease_ms
            if later is not None and out.state is S.SUBMITTED:
                again = self.step(task_id, S.SCHEDULED, sources=(S.SUBMITTED,),
                                  delay_ms=later[0], reason=later[1])
                if again.applied:
                    out = StepResult(True, out.previous, now, out.attempt, S.SCHEDULED,
                                     out.values)
            if rec is None and create and create.get("wf") and self._join_workflow(
                    task_id, create, now) and out.state in (S.SUBMITTED, S.SCHEDULED):
                again = self.step(task_id, S.CANCELLED, sources=(out.state,),
                                  reason=WORKFLOW_CANCELLED)
                if again.applied:
                    out = StepResult(True, out.previous, now, out.attempt, S.CANCELLED,
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
        elif create and cur is S.UNSUBMITTED and before.get("rpl"):
            # the publish of the task a replace() gave this id: the record becomes its own
            w.update({k: v for k, v in create.items() if k != "attempt"})
            d += [f for f in ("ver", "dlq") if f not in create]
            if not (set_fields or {}).get("retries"):
                d.append("retries")
            d.append("rpl")
        if bump and not start:
            attempt += 1
            w["attempt"] = str(attempt)
        if start:
            attempt += 1
            w.update(attempt=str(attempt), hb_at=str(now),
                     ql=self._queue_latency(before, cur, now))
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
        if rec is not None:
            self._series_step(before, cur, to, now, attempt)
        values = {r: ("" if r in d and r not in w else w.get(r, before.get(r, "")))
                  for r in ret}
        return StepResult(applied=True, previous=cur.value if rec is not None else "missing",
                          now_ms=now, attempt=attempt, state=to, values=values)

    @property
    def unique_locks(self) -> MemoryLocks:
        """The unique tasks' locks (made at first use)."""
        locks = self.__dict__.get("_unique_locks")
        if locks is None:
            locks = self.__dict__["_unique_locks"] = MemoryLocks()
        return locks

    def unique_holder(self, digest: str) -> str | None:
        """As :func:`jobbers_celery.store.unique.unique_holder`."""
        with self._lock:
            return self.unique_locks.holder(self._records, digest, self.now_ms())

    def unique_of(self, task_id: str) -> UniqueInfo | None:
        """As :func:`jobbers_celery.store.unique.unique_of`."""
        with self._lock:
            return self.unique_locks.info(self._records, task_id, self.now_ms())

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

    def remove_terminal(self, ids: Sequence[str]) -> int:
        """Delete the finished records among ``ids`` now."""
        with self._lock:
            gone = [i for i in ids
                    if (self._records.get(i) or {}).get("state") in {s.value for s in TERMINAL}]
            for i in gone:
                del self._records[i]
            return len(gone)

    def purge(self, name: str | None, queue: str | None, before_ms: int | None
              ) -> tuple[int, list[str], list[str]]:
        """As the Redis store's purge: finished records removed, submitted and scheduled
        tasks cancelled (marked ``purged``), others skipped; (removed, cancelled, skipped)."""
        with self._lock:
            picked = [i for i, r in self._records.items()
                      if (name is None or r.get("name") == name)
                      and (queue is None or r.get("queue") == queue)
                      and (before_ms is None or int(r.get("sub_at") or 0) < before_ms)]
            cancelled: list[str] = []
            skipped: list[str] = []
            removed = self.remove_terminal(picked)
            for i in picked:
                state = (self._records.get(i) or {}).get("state")
                if state in ("submitted", "scheduled"):
                    if self.cancel(i, "purged", set_fields={"purged": "1"}).outcome != "no":
                        cancelled.append(i)
                elif state is not None:
                    skipped.append(i)
            return removed, cancelled, skipped
