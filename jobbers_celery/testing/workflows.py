"""Workflows in memory (the ``WorkflowStore`` part): a canvas's members, read through the
index its members' ``submit`` steps wrote (:meth:`Memory._join_workflow`), and its cancel
mark; resolved as the Redis store resolves them (``store/workflows.py``)."""

from __future__ import annotations

from collections import Counter

from jobbers_celery.core.records import from_ms
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.workflow import MemberRead, WorkflowRead
from jobbers_celery.testing.memory import Memory, history_of, record_of

__all__ = ["MemoryWorkflows"]


class MemoryWorkflows(Memory):
    """The workflow reads and the cancel mark of the in-memory store."""

    def workflow(self, task_id: str, limit: int) -> WorkflowRead | None:
        with self._lock:
            rec = self._records.get(task_id)
            if rec is not None:
                key = rec.get("wf") or task_id
            elif self._workflows.get(task_id):
                key = task_id
            elif task_id in self._workflow_aliases:
                key = self._workflow_aliases[task_id]
            else:
                return None
            index = dict(self._workflows.get(key) or {})
            root = self._records.get(key)
            if root is not None and key not in index:
                index[key] = int(root.get("sub_at") or 0)
            ordered = sorted(index.items(), key=lambda kv: (kv[1], kv[0]))
            members = []
            for member_id, _ in ordered[:limit]:
                raw = self._records.get(member_id)
                if raw is None:
                    continue
                members.append(MemberRead(record_of(member_id, raw),
                                          history_of(member_id, raw),
                                          chord=raw.get("chd") or None,
                                          successors=raw.get("nxt") == "1"))
            if not members:
                return None
            cancelled = self._workflows_cancelled.get(key)
            truncated = len(ordered) > limit
            states = Counter(TaskState(r["state"]) for r in (
                self._records.get(i) for i, _ in ordered) if r is not None)
            return WorkflowRead(key, members, len(ordered),
                                cancelled_at=from_ms(cancelled) if cancelled else None,
                                truncated=truncated, states=dict(states) if truncated else None)

    def mark_workflow_cancelled(self, root_id: str, cancelled: bool) -> None:
        with self._lock:
            if cancelled:
                self._workflows_cancelled.setdefault(root_id, self.now_ms())
            else:
                self._workflows_cancelled.pop(root_id, None)
