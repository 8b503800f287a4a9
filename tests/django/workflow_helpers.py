"""A workflow as ``Jobbers.workflow`` answers it, for the API and admin tests that check
how it is shown (the real canvases, recorded by publishing them, are in the tests too): a
chord whose header member failed, one member still running, its callback not recorded
yet, and a secret in a member's progress and error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jobbers_celery import (
    ErrorInfo,
    TaskRecord,
    TaskState,
    Workflow,
    WorkflowMember,
    WorkflowState,
    WorkflowTransition,
)

S = TaskState
T0 = datetime(2026, 11, 26, 15, 0, 0, tzinfo=UTC)
SECRET = "wf-secret-sk_live_9"


def record(task_id: str, state: TaskState, *, name: str = "shop.import_part",
           started: float | None = 1, ended: float | None = 4, **over: Any) -> TaskRecord:
    values: dict[str, Any] = {
        "task_id": task_id, "name": name, "version": None, "queue": "imports",
        "state": state, "attempt": 1, "retry_attempt": 0, "submitted_at": T0,
        "started_at": T0 + timedelta(seconds=started) if started is not None else None,
        "retried_at": None,
        "completed_at": T0 + timedelta(seconds=ended) if ended is not None else None,
        "heartbeat_at": None, "run_at": None, "worker": "celery@w1", "error": None,
        "progress": None, "checkpoint": None}
    values.update(over)
    return TaskRecord(**values)


def chord_workflow(root: str = "hdr-1", *, group: str = "grp-1") -> Workflow:
    """``chord([hdr-1, hdr-2, hdr-3], cb)``: hdr-1 completed, hdr-2 failed (blocking),
    hdr-3 running (its progress a fraction); the callback expected."""
    members = [
        WorkflowMember(record(root, S.COMPLETED, group_id=group, root_id=root), None, group,
                       "header"),
        WorkflowMember(record("hdr-2", S.FAILED, group_id=group, root_id="hdr-2",
                              error=ErrorInfo("ValueError", f"token={SECRET} refused")),
                       None, group, "header"),
        WorkflowMember(record("hdr-3", S.STARTED, ended=None, group_id=group,
                              root_id="hdr-3",
                              progress={"done": 3, "total": 4, "api_key": SECRET}),
                       None, group, "header"),
    ]
    return Workflow(
        root_id=group, state=WorkflowState.RUNNING, members=members, total=4, completed=1,
        failed=1, running=1, pending=1, cancelled=0, started_at=T0, ended_at=None,
        elapsed=timedelta(seconds=75), blocking=["hdr-2"],
        history=[
            WorkflowTransition(T0, WorkflowState.RUNNING, f"shop.import_part[{root}] "
                               "submitted", root),
            WorkflowTransition(T0 + timedelta(seconds=4), WorkflowState.RUNNING,
                               "member shop.import_part[hdr-2] failed", "hdr-2"),
        ],
        truncated=False)


class FakeWorkflows:
    """What ``Jobbers.workflow``, ``cancel_workflow`` and ``resubmit_workflow`` answer,
    and the calls they got."""

    def __init__(self, flow: Workflow | None, *, cancel: list[str] | None = None,
                 resubmit: list[str] | None = None) -> None:
        self.flow = flow
        self.cancel = cancel or []
        self.resubmit = resubmit or []
        self.calls: list[tuple[Any, ...]] = []

    def install(self, monkeypatch: Any, jobbers: Any) -> FakeWorkflows:
        monkeypatch.setattr(jobbers, "workflow", self.workflow)
        monkeypatch.setattr(jobbers, "cancel_workflow", self.cancel_workflow)
        monkeypatch.setattr(jobbers, "resubmit_workflow", self.resubmit_workflow)
        monkeypatch.setattr(jobbers, "now", lambda: T0 + timedelta(seconds=75))
        return self

    def workflow(self, task_id: str, limit: int = 1000) -> Workflow | None:
        self.calls.append(("workflow", task_id, limit))
        return self.flow

    def cancel_workflow(self, task_id: str, terminate: bool = False) -> list[str]:
        self.calls.append(("cancel", task_id, terminate))
        return list(self.cancel)

    def resubmit_workflow(self, task_id: str, reset_retry_count: bool = True) -> list[str]:
        self.calls.append(("resubmit", task_id, reset_retry_count))
        return list(self.resubmit)
