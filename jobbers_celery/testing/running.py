"""What a worker sends while its tasks run, in memory (the ``RunningStore`` part):
heartbeats, each kept in ``heartbeats`` for a test to read."""

from __future__ import annotations

from jobbers_celery.store.base import Heartbeat
from jobbers_celery.testing.memory import HeartbeatSent, Memory

__all__ = ["MemoryRunning"]


class MemoryRunning(Memory):
    """Heartbeats (the liveness refresh answers "nothing to do": see ``idle.py``)."""

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
