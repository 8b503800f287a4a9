"""Pauses and held tasks, in memory (the ``PauseStore`` part): a hold and a release are
steps under the one lock, each checking the pause as ``hold.lua`` and ``release.lua`` do."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from jobbers_celery.core.pauses import HELD_DELAY_MS, Pause, PauseKind
from jobbers_celery.core.states import TaskState
from jobbers_celery.store.base import Claimed, StepResult
from jobbers_celery.testing.steps import MemorySteps

__all__ = ["MemoryPauses"]

S = TaskState


class MemoryPauses(MemorySteps):
    """The pause part of the in-memory store."""

    def __init__(self) -> None:
        super().__init__()
        self._pauses: dict[tuple[PauseKind, str], tuple[int, str]] = {}
        self._held: dict[str, dict[str, int]] = {}  # name -> {id: held at ms}

    def pause(self, kind: PauseKind, target: str, by: str) -> bool:
        with self._lock:
            if (kind, target) in self._pauses:
                return False
            self._pauses[(kind, target)] = (self.now_ms(), by)
            return True

    def unpause(self, kind: PauseKind, target: str) -> bool:
        with self._lock:
            return self._pauses.pop((kind, target), None) is not None

    def pauses(self) -> list[Pause]:
        with self._lock:
            items = list(self._pauses.items())
        out = [Pause(k, t, datetime.fromtimestamp(at / 1000.0, tz=UTC), by)
               for (k, t), (at, by) in items]
        return sorted(out, key=lambda p: (p.at, p.kind, p.target))

    def hold(self, task_id: str, name: str, *, worker: str | None,
             reason: str) -> StepResult:
        with self._lock:
            if (PauseKind.TASK, name) not in self._pauses:
                rec = self._records.get(task_id)
                return StepResult(applied=False, previous=rec["state"] if rec else "missing",
                                  now_ms=self.now_ms(), attempt=0, why="not_paused")
            res = self.step(task_id, S.SCHEDULED, sources=(S.SUBMITTED,),
                            delay_ms=HELD_DELAY_MS, cancellable=True, worker=worker,
                            reason=reason)
            if res.applied and res.state is S.SCHEDULED:
                self._records[task_id].pop("run_at", None)
                self._held.setdefault(name, {})[task_id] = res.now_ms
            return res

    def held_ids(self, name: str, limit: int = 500) -> list[list[str]]:
        with self._lock:
            held = sorted(self._held.get(name, {}).items(), key=lambda kv: kv[1])
        return [[i for i, _ in held[:limit]]]

    def held_count(self, name: str) -> int:
        with self._lock:
            return len(self._held.get(name, {}))

    def release(self, name: str, ids: Sequence[str], *, lease_ms: int, worker: str | None,
                reason: str) -> list[Claimed] | None:
        out: list[Claimed] = []
        with self._lock:
            if (PauseKind.TASK, name) in self._pauses:
                return None
            held = self._held.get(name, {})
            for task_id in ids:
                rec = self._records.get(task_id) or {}
                if rec.get("state") == "scheduled" and not rec.get("run_at"):
                    res = self.step(task_id, S.SUBMITTED, sources=(S.SCHEDULED,),
                                    lease_ms=lease_ms, worker=worker, reason=reason,
                                    ret=("msg", "retries", "name", "queue"))
                    if res.applied:
                        v = res.values
                        out.append(Claimed(task_id, v.get("msg", ""),
                                           int(v.get("retries") or 0), v.get("name", ""),
                                           None, v.get("queue", "")))
                held.pop(task_id, None)
        return out

    def oldest_submitted(self, queues: Sequence[str], scan: int = 2000
                         ) -> dict[str, tuple[int, str]]:
        wanted = set(queues)
        out: dict[str, tuple[int, str]] = {}
        with self._lock:
            for task_id, rec in self._records.items():
                queue, at = rec.get("queue"), int(rec.get("sub_at") or 0)
                if rec.get("state") == "submitted" and queue in wanted \
                        and (queue not in out or at < out[queue][0]):
                    out[queue] = (at, task_id)
        return out
