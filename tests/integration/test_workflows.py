"""Canvases as units with real prefork workers and the session's Redis (16 shards, so a
workflow's members spread over shards): a chain, a group, a chord whose callback ran, a
nested canvas, and a cancel of a running workflow (workflow_cases.py)."""

from __future__ import annotations

from typing import Any

import pytest

from jobbers_celery import WorkflowState
from tests.integration import workflow_cases

pytestmark = [pytest.mark.redis, pytest.mark.worker]


@pytest.mark.parametrize("case", [
    workflow_cases.a_chain_completes,
    workflow_cases.a_group_completes,
    workflow_cases.a_chord_completes_when_its_callback_ran,
    workflow_cases.a_nested_canvas_is_one_workflow,
    workflow_cases.cancelling_a_running_workflow_cancels_its_members,
    workflow_cases.a_chord_cancelled_by_its_callbacks_id,
], ids=lambda case: case.__name__)
def test_canvas(proj: Any, worker_factory: Any, case: Any) -> None:
    case(proj, worker_factory(concurrency=4))


def test_members_spread_over_shards_and_leave_with_their_records(proj: Any,
                                                          worker_factory: Any) -> None:
    wf = workflow_cases.a_group_completes(proj, worker_factory(concurrency=2))
    store = proj.jobbers.store
    shards = {store.shards.index(m.record.task_id) for m in wf.members}
    keys = [k.workflow(wf.root_id) for k in store.shards.keys]
    assert sum(store.client.exists(k) for k in keys) == len(shards) > 1
    assert wf.state is WorkflowState.COMPLETED
    # removing the records (pruning after the retention period, purge) empties the index
    assert store.remove_terminal([m.record.task_id for m in wf.members]) == len(wf.members)
    assert sum(store.client.exists(k) for k in keys) == 0
    assert proj.jobbers.workflow(wf.root_id) is None


def test_members_published_without_a_record_join_their_workflow(
        proj: Any, worker_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis unreachable at publish: the worker records each member late, in its workflow
    (read from the message: its group, and the key the publisher stamped)."""
    import redis
    from celery import group

    def unreachable(*args: object, **kwargs: object) -> None:
        raise redis.ConnectionError("Redis is unreachable (simulated)")

    with monkeypatch.context() as patched:
        patched.setattr(proj.jobbers.store, "step", unreachable)
        res = group(proj.add.s(1, 1), proj.add.s(2, 2)).apply_async()
    assert proj.jobbers.workflow(res.id) is None
    worker = worker_factory(concurrency=2)
    assert res.get(timeout=20) == [2, 4]
    wf = workflow_cases.settled(proj.jobbers, res.id, 2, WorkflowState.COMPLETED, worker)
    assert {m.record.task_id for m in wf.members} == {r.id for r in res.results}
    assert {proj.jobbers.history(m.record.task_id)[0].reason for m in wf.members} == {
        "recorded by the worker: no submission record"}


def test_a_workflow_read_in_part_on_a_redis_without_zintercard(
        proj: Any, worker_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis 6 has no ZINTERCARD: a workflow read in part (more members than the limit)
    counts the members read instead of failing."""
    import redis

    wf = workflow_cases.a_group_completes(proj, worker_factory(concurrency=2))
    store = proj.jobbers.store
    real = type(store)._pipeline_each

    def redis_6(self: Any, commands: Any) -> Any:
        if commands and commands[0][0] == "zintercard":
            raise redis.ResponseError("unknown command 'zintercard', with args beginning with: ")
        return real(self, commands)

    monkeypatch.setattr(type(store), "_pipeline_each", redis_6)
    part = proj.jobbers.workflow(wf.root_id, limit=1)
    assert part is not None
    assert part.truncated
    assert len(part.members) == 1
    assert part.total == wf.total
