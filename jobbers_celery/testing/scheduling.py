"""Delayed tasks coming due and publish leases, in memory (the ``SchedulingStore`` part):
what the scheduler claims and publishes, each due id at most once (as ``claim.lua``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from jobbers_celery.core.states import TaskState
from jobbers_celery.store.base import Claimed
from jobbers_celery.testing.steps import MemorySteps

__all__ = ["MemoryScheduling"]

S = TaskState
_CLAIM_RETURNS = ("msg", "retries", "name", "queue")


class MemoryScheduling(MemorySteps):
    """The scheduling part of the in-memory store (its claims are steps)."""

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

    def claim(self, ids: Sequence[str], lease_ms: int, worker: str | None,
              released: Collection[str] = ()) -> list[Claimed]:
        """As ``claim.lua``: each due id at most once, whoever else claims."""
        out: list[Claimed] = []
        with self._lock:
            now = self.now_ms()
            for task_id in ids:
                rec = self._records.get(task_id) or {}
                state, run_at = rec.get("state"), rec.get("run_at")
                came = bool(run_at) and int(run_at or 0) <= now
                if state == "scheduled" and (came or task_id in released):
                    res = self.step(task_id, S.SUBMITTED, sources=(S.SCHEDULED,),
                                    lease_ms=lease_ms, worker=worker,
                                    reason="run_at reached" if came
                                    else "released: its key has room (fair share)",
                                    ret=_CLAIM_RETURNS)
                    if res.applied:
                        out.append(self._claimed(task_id, res.values,
                                                 int(run_at or 0) if came else None))
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
