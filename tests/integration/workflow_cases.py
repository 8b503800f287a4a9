"""Canvases as units on a real store and real workers (``Jobbers.workflow``,
``cancel_workflow``): shared by test_workflows.py (one Redis, 16 shards) and
test_on_cluster.py (a Redis Cluster)."""

from __future__ import annotations

from typing import Any

from celery import chain, chord, group

from jobbers_celery import TaskState, Workflow, WorkflowState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import unique, wait_state

S = TaskState
W = WorkflowState


def settled(jobbers: Any, task_id: str, members: int, state: WorkflowState,
            worker: Any = None, timeout: float = 20.0) -> Workflow:
    """The workflow of ``task_id`` once it has ``members`` members and is in ``state``."""
    last: list[Workflow | None] = [None]

    def done() -> Workflow | None:
        last[0] = wf = jobbers.workflow(task_id)
        return wf if wf is not None and len(wf.members) == members and wf.state is state \
            else None
    try:
        found: Workflow = wait_for(done, timeout=timeout, message=f"workflow of {task_id}")
    except AssertionError as exc:
        raise AssertionError(f"workflow of {task_id}: {last[0]}"
                             + (f"\nworker log:\n{worker.log[-6000:]}" if worker else "")
                             ) from exc
    return found


def a_chain_completes(proj: Any, worker: Any) -> Workflow:
    res = chain(proj.add.s(1, 1), proj.add.s(2), proj.add.s(3)).apply_async()
    assert res.get(timeout=20) == 7
    first, second = res.parent.parent.id, res.parent.id
    wf = settled(proj.jobbers, second, 3, W.COMPLETED, worker)
    assert wf.root_id == first
    assert [m.record.task_id for m in wf.members] == [first, second, res.id]
    assert [m.role for m in wf.members] == ["root", "member", "member"]
    assert [m.parent_id for m in wf.members] == [None, first, second]
    assert {m.record.root_id for m in wf.members} == {first}
    assert (wf.total, wf.completed, wf.running, wf.pending, wf.failed) == (3, 3, 0, 0, 0)
    assert wf.history[0].state is W.RUNNING
    assert wf.history[-1].state is W.COMPLETED
    # the end that completed it: the member that ended last (the second link may record its
    # end after the third, which it published, has ended)
    last = max(m.record.completed_at for m in wf.members if m.record.completed_at)
    assert wf.history[-1].task_id in {m.record.task_id for m in wf.members
                                      if m.record.completed_at == last}
    return wf


def a_group_completes(proj: Any, worker: Any) -> Workflow:
    res = group(proj.add.s(i, i) for i in range(6)).apply_async()
    assert res.get(timeout=20) == [0, 2, 4, 6, 8, 10]
    wf = settled(proj.jobbers, res.id, 6, W.COMPLETED, worker)
    assert wf.root_id == res.id  # a top-level group: no common root, its id names it
    assert {m.record.task_id for m in wf.members} == {r.id for r in res.results}
    assert {m.group_id for m in wf.members} == {res.id}
    assert proj.jobbers.workflow(res.results[3].id).root_id == res.id
    part = proj.jobbers.workflow(res.id, limit=2)  # counted in the indexes beyond the limit
    assert (part.truncated, len(part.members), part.total) == (True, 2, 6)
    assert (part.state, part.completed, part.pending) == (W.COMPLETED, 6, 0)
    return wf


def a_chord_completes_when_its_callback_ran(proj: Any, worker: Any) -> Workflow:
    res = chord([proj.add.s(1, 1), proj.add.s(2, 2), proj.add.s(3, 3)],
                proj.tsum.s()).apply_async()
    assert res.get(timeout=20) == 12
    group_id = res.parent.id
    wf = settled(proj.jobbers, group_id, 4, W.COMPLETED, worker)
    assert wf.root_id == group_id
    roles = {m.record.task_id: m.role for m in wf.members}
    assert roles.pop(res.id) == "callback"
    assert set(roles.values()) == {"header"}
    assert wf.members[-1].record.task_id == res.id
    assert wf.history[-1].reason == f"callback proj.tsum[{res.id}] ran: completed"
    assert proj.jobbers.workflow(res.id).root_id == group_id  # the callback names it too
    return wf


def a_nested_canvas_is_one_workflow(proj: Any, worker: Any) -> Workflow:
    res = chain(proj.add.s(1, 1), group(proj.add.s(1), proj.add.s(2)), proj.tsum.s(),
                proj.add.s(5)).apply_async()
    assert res.get(timeout=20) == 12
    wf = settled(proj.jobbers, res.id, 5, W.COMPLETED, worker)
    first = wf.members[0]
    assert first.role == "root"
    assert wf.root_id == first.record.task_id
    assert sorted(m.role for m in wf.members) == ["callback", "header", "header", "member",
                                                  "root"]
    header = next(m for m in wf.members if m.role == "header")
    assert header.parent_id == first.record.task_id
    assert header.group_id is not None
    assert proj.jobbers.workflow(header.group_id).root_id == wf.root_id
    return wf


def cancelling_a_running_workflow_cancels_its_members(proj: Any, worker: Any) -> Workflow:
    key = unique("wf-cancel")
    res = group(proj.heartbeating.s(f"{key}:{i}", 30) for i in range(2)).apply_async()
    ids = [r.id for r in res.results]
    for task_id in ids:
        wait_state(proj.jobbers, task_id, S.STARTED, worker=worker)
    assert sorted(proj.jobbers.cancel_workflow(res.id)) == sorted(ids)
    wf = settled(proj.jobbers, res.id, 2, W.CANCELLED, worker)
    assert [m.record.state for m in wf.members] == [S.CANCELLED, S.CANCELLED]
    assert wf.cancelled == 2
    assert any(t.reason == "cancelled by request" for t in wf.history)
    # a member published into it afterwards is cancelled as it is recorded, never run
    late = proj.add.apply_async((1, 1), group_id=res.id)
    record = wait_state(proj.jobbers, late.id, S.CANCELLED, worker=worker)
    assert [t.reason for t in proj.jobbers.history(record.task_id)][-1] == \
        "its workflow was cancelled"
    # and one with a countdown (its delayed first publish waits in the store) too
    later = proj.add.apply_async((1, 1), group_id=res.id, countdown=30)
    record = wait_state(proj.jobbers, later.id, S.CANCELLED, worker=worker)
    assert [t.to_state for t in proj.jobbers.history(later.id)] == [
        S.SUBMITTED, S.SCHEDULED, S.CANCELLED]
    return wf


def a_chord_cancelled_by_its_callbacks_id(proj: Any, worker: Any) -> Workflow:
    """The id ``apply_async`` returned for a chord (its callback's, not published yet)
    names the workflow: cancelling it cancels the running header member, and the callback
    never runs (Celery's result backend: the member REVOKED)."""
    key = unique("wf-chord")
    res = chord([proj.heartbeating.s(key, 30), proj.add.s(1, 1)], proj.tsum.s()).apply_async()
    held, done = (r.id for r in res.parent.results)
    wait_state(proj.jobbers, held, S.STARTED, worker=worker)
    wait_state(proj.jobbers, done, S.COMPLETED, worker=worker)
    wf = proj.jobbers.workflow(res.id)
    assert wf is not None
    assert (wf.root_id, wf.state, wf.total, wf.pending) == (res.parent.id, W.RUNNING, 3, 1)
    assert proj.jobbers.cancel_workflow(res.id) == [held]
    wf = settled(proj.jobbers, res.id, 2, W.CANCELLED, worker)
    assert {m.record.task_id: m.record.state for m in wf.members} == {
        held: S.CANCELLED, done: S.COMPLETED}
    assert proj.jobbers.get(res.id) is None  # the callback was never published
    wait_for(lambda: proj.app.AsyncResult(held).state == "REVOKED")
    return wf
