"""Records, histories, listings and counts in memory (the ``ReadStore`` part), each
parsed by the Redis store's own parsers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from jobbers_celery.core.records import TaskRecord, Transition
from jobbers_celery.core.states import TaskState
from jobbers_celery.store.base import StepResult
from jobbers_celery.testing.memory import Memory, history_of, record_of

__all__ = ["MemoryReads"]

S = TaskState


class MemoryReads(Memory):
    """The reads of the in-memory store."""

    def get(self, task_id: str) -> TaskRecord | None:
        raw = self.get_raw(task_id)
        return record_of(task_id, raw) if raw else None

    def get_raw(self, task_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._records.get(task_id) or {})

    def history(self, task_id: str) -> list[Transition]:
        return history_of(task_id, self.get_raw(task_id))

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
        picked = [record_of(i, r) for i, r in rows
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
        return [record_of(i, r) for _, i, r in rows[:limit]]

    def refused_counts(self) -> dict[str, int]:
        """How many steps were refused, per ``from>to`` (and refused heartbeats)."""
        with self._lock:
            return dict(self._refused)
