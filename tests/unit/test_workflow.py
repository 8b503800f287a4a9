"""A canvas as one unit (``Jobbers.workflow``, ``cancel_workflow``, ``resubmit_workflow``)
on the in-memory kit: real chains, groups, chords and nested canvases run on an embedded
worker (memory broker, no Redis); the pure parts (the fields taken from a message, the
state and history derived from members) on hand-made values."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery, chain, chord, group

from jobbers_celery import (
    Jobbers,
    JobbersTask,
    TaskRecord,
    TaskState,
    Transition,
    Workflow,
    WorkflowState,
)
from jobbers_celery.core.intake import MAX_ID_CHARS
from jobbers_celery.core.workflow import (
    HEADER_WORKFLOW,
    MemberRead,
    WorkflowRead,
    derive,
    links,
    workflow_key,
)
from jobbers_celery.testing import (
    InMemoryDeadLetterSink,
    InMemoryStore,
    embedded_worker,
    in_memory,
)
from tests.conftest import wait_for

S = TaskState
W = WorkflowState
app = Celery("fast_workflow", broker="memory://", backend="cache+memory://")
app.conf.broker_transport_options = {"polling_interval": 0.01}


@app.task(base=JobbersTask, bind=True, name="wf.add", shared=False)
def add(self: JobbersTask, x: int, y: int = 0) -> int:
    return x + y


@app.task(base=JobbersTask, bind=True, name="wf.tsum", shared=False)
def tsum(self: JobbersTask, xs: list[int]) -> int:
    return sum(xs)


@app.task(base=JobbersTask, bind=True, name="wf.boom", dead_letter_policy="save",
          shared=False)
def boom(self: JobbersTask, *_: Any) -> None:
    raise KeyError("boom")


@app.task(base=JobbersTask, bind=True, name="wf.hold", shared=False)
def hold(self: JobbersTask, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded: stops at a heartbeat once cancelled
        self.heartbeat()
        time.sleep(0.01)


@app.task(base=JobbersTask, bind=True, name="wf.fan", shared=False)
def fan(self: JobbersTask, n: int) -> Any:
    return self.replace(group(add.s(i, i) for i in range(n)))


@app.task(name="wf.plain", shared=False)
def plain(x: int) -> int:
    return x


@pytest.fixture(scope="module")
def jobbers() -> Iterator[Jobbers]:
    jobbers = in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())
    with embedded_worker(app, shutdown_timeout=30, pool="threads", concurrency=4):
        yield jobbers


def _sink(jobbers: Jobbers) -> InMemoryDeadLetterSink:
    assert isinstance(jobbers.sink, InMemoryDeadLetterSink)
    return jobbers.sink


def _settled(jobbers: Jobbers, task_id: str, n: int | None = None,
             state: WorkflowState | None = None) -> Workflow:
    def done() -> Workflow | None:
        wf = jobbers.workflow(task_id)
        if wf is None or (n is not None and len(wf.members) != n):
            return None
        if state is not None:
            return wf if wf.state is state else None
        return wf if wf.state is not W.RUNNING else None
    found: Workflow = wait_for(done, timeout=15, message=f"workflow of {task_id}")
    return found


# ---------------------------------------------------------------------- on the kit
def test_a_chain_is_one_workflow_rooted_at_its_first_link(jobbers: Jobbers) -> None:
    res = chain(add.s(1, 1), add.s(2), add.s(3)).apply_async()
    assert res.get(timeout=10) == 7
    first = res.parent.parent.id
    wf = _settled(jobbers, res.id, 3)
    assert wf.root_id == first
    assert wf.state is W.COMPLETED
    assert [m.record.task_id for m in wf.members] == [first, res.parent.id, res.id]
    assert [m.role for m in wf.members] == ["root", "member", "member"]
    assert [m.parent_id for m in wf.members] == [None, first, res.parent.id]
    assert (wf.total, wf.completed, wf.failed, wf.running, wf.pending) == (3, 3, 0, 0, 0)
    assert wf.blocking == []
    assert not wf.truncated
    assert wf.members[0].record.root_id == first
    assert wf.history[0].state is W.RUNNING
    assert wf.history[0].task_id == first
    assert wf.history[-1].state is W.COMPLETED
    assert "completed" in wf.history[-1].reason
    assert wf.ended_at is not None
    assert wf.elapsed is not None
    # any member names it
    assert jobbers.workflow(first) == jobbers.workflow(res.parent.id)


def test_a_group_is_named_by_its_group_id(jobbers: Jobbers) -> None:
    res = group(add.s(i, i) for i in range(4)).apply_async()
    assert res.get(timeout=10) == [0, 2, 4, 6]
    wf = _settled(jobbers, res.id, 4)
    assert wf.root_id == res.id
    assert wf.state is W.COMPLETED
    assert {m.record.task_id for m in wf.members} == {r.id for r in res.results}
    assert {m.group_id for m in wf.members} == {res.id}
    assert {m.role for m in wf.members} == {"member"}
    assert jobbers.workflow(res.results[2].id).root_id == res.id  # type: ignore[union-attr]


def test_a_chord_completes_when_its_callback_ran(jobbers: Jobbers) -> None:
    res = chord([add.s(1, 1), add.s(2, 2)], tsum.s()).apply_async()
    assert res.get(timeout=10) == 6
    wf = _settled(jobbers, res.id, 3)
    assert wf.root_id == res.parent.id  # the header's group id
    roles = {m.record.task_id: m.role for m in wf.members}
    assert roles[res.id] == "callback"
    assert sorted(roles.values()) == ["callback", "header", "header"]
    assert wf.state is W.COMPLETED
    assert wf.history[-1].reason.startswith("callback wf.tsum")
    assert wf.history[-1].task_id == res.id


def test_a_nested_canvas_is_one_workflow(jobbers: Jobbers) -> None:
    res = chain(add.s(1, 1), group(add.s(1), add.s(2)), tsum.s(), add.s(5)).apply_async()
    assert res.get(timeout=10) == 12
    wf = _settled(jobbers, res.id, 5)
    first = wf.members[0].record.task_id
    assert wf.root_id == first
    assert wf.state is W.COMPLETED
    assert [m.role for m in wf.members].count("header") == 2
    assert [m.role for m in wf.members].count("callback") == 1
    # the group nested in the chain names the workflow too
    header = next(m for m in wf.members if m.role == "header")
    assert header.group_id is not None
    assert jobbers.workflow(header.group_id).root_id == first  # type: ignore[union-attr]


def test_a_chord_callback_names_its_workflow_before_it_runs(jobbers: Jobbers) -> None:
    res = chord([hold.s(20), add.s(1, 1)], tsum.s()).apply_async()
    wait_for(lambda: jobbers.workflow(res.id))  # its id, before it is published
    wf = jobbers.workflow(res.id)
    assert wf is not None
    assert wf.root_id == res.parent.id
    assert wf.state is W.RUNNING
    assert wf.total == 3  # the callback is expected
    held = res.parent.results[0].id
    wait_for(lambda: (r := jobbers.get(held)) is not None and r.state is S.STARTED)
    assert held in jobbers.cancel_workflow(res.id)
    wf = _settled(jobbers, res.id, 2)
    assert wf.state is W.CANCELLED
    assert wf.total == 2  # a header member cancelled: the callback is not expected any more


def test_what_a_replace_fans_out_is_in_the_replaced_tasks_workflow(jobbers: Jobbers) -> None:
    res = fan.delay(3)
    assert res.get(timeout=10) == [0, 2, 4]
    wf = _settled(jobbers, res.id, 4)
    assert wf.state is W.COMPLETED
    assert [(m.record.name, m.role) for m in wf.members] == [
        ("wf.fan", "root"), ("wf.add", "member"), ("wf.add", "member"), ("wf.add", "member")]
    assert {m.parent_id for m in wf.members[1:]} == {res.id}


def test_a_failed_chord_member_fails_the_workflow_and_blocks_it(jobbers: Jobbers) -> None:
    res = chord([add.s(1, 1), boom.s()], tsum.s()).apply_async()
    wf = _settled(jobbers, res.parent.id, 2)
    assert wf.state is W.FAILED
    failed = next(m for m in wf.members if m.record.name == "wf.boom")
    assert wf.blocking == [failed.record.task_id]
    assert (wf.completed, wf.failed, wf.pending) == (1, 1, 0)
    # boom ended the workflow (it failed last) or named it when the add ended it (it failed
    # while the add still ran): which depends on which of the two ended first
    added = next(m.record.task_id for m in wf.members if m.record.name == "wf.add")
    boomed = f"wf.boom[{failed.record.task_id}]"
    end = wf.history[-1]
    assert end.state is W.FAILED
    assert end.reason in (f"member {boomed} failed",
                          f"wf.add[{added}] ended, nothing left to run: failed ({boomed} failed)")


def test_cancel_workflow_cancels_its_running_and_waiting_members(jobbers: Jobbers) -> None:
    res = chain(hold.s(20), add.si(1, 1)).apply_async()
    first = res.parent.id
    wait_for(lambda: (r := jobbers.get(first)) is not None and r.state is S.STARTED)
    # the chain's result (its last link, not published yet) names the workflow already
    assert jobbers.workflow(res.id).root_id == first  # type: ignore[union-attr]
    assert jobbers.cancel_workflow(res.id) == [first]
    wf = _settled(jobbers, first, 1, W.CANCELLED)
    assert wf.members[0].record.state is S.CANCELLED
    assert wf.history[-1].state is W.CANCELLED
    assert any(t.reason == "cancelled by request" for t in wf.history)
    assert jobbers.get(res.id) is None  # the chain stopped there


def test_a_member_published_after_the_cancel_is_cancelled_as_recorded(
        jobbers: Jobbers) -> None:
    res = group(hold.s(20), hold.s(20)).apply_async()
    wait_for(lambda: (wf := jobbers.workflow(res.id)) is not None and wf.running == 2)
    assert sorted(jobbers.cancel_workflow(res.id)) == sorted(r.id for r in res.results)
    late = add.apply_async((1, 1), group_id=res.id)  # joins the cancelled workflow
    record = wait_for(lambda: jobbers.get(late.id))
    assert record.state is S.CANCELLED
    assert [t.reason for t in jobbers.history(late.id)][-1] == "its workflow was cancelled"
    later = add.apply_async((1, 1), group_id=res.id, countdown=30)
    assert [t.to_state for t in jobbers.history(later.id)] == [
        S.SUBMITTED, S.SCHEDULED, S.CANCELLED]
    assert later.state == "REVOKED"  # as Celery's revoke says of a task that never ran
    assert _settled(jobbers, res.id, 4, W.CANCELLED).cancelled == 4


def test_a_resubmit_that_resubmits_nothing_leaves_a_cancelled_workflow_cancelled(
        jobbers: Jobbers) -> None:
    res = group(hold.s(20), hold.s(20)).apply_async()
    wait_for(lambda: (wf := jobbers.workflow(res.id)) is not None and wf.running == 2)
    assert jobbers.cancel_workflow(res.id)
    assert jobbers.resubmit_workflow(res.id) == []  # no failed member: the mark stays
    late = add.apply_async((1, 1), group_id=res.id)
    assert wait_for(lambda: jobbers.get(late.id)).state is S.CANCELLED


def test_an_id_that_names_a_workflow_is_not_taken_over_by_a_later_message(
        jobbers: Jobbers) -> None:
    """A chain's result id names its workflow before its last link is recorded; a crafted
    message naming that id as its group, under a workflow of its own, cannot take it."""
    res = chain(hold.s(20), add.si(1, 1)).apply_async()
    first = res.parent.id
    wait_for(lambda: (r := jobbers.get(first)) is not None and r.state is S.STARTED)
    crafted = add.apply_async((2, 2), group_id=res.id, headers={HEADER_WORKFLOW: "evil"})
    wait_for(lambda: jobbers.get(crafted.id))
    wf = jobbers.workflow(res.id)
    assert wf is not None
    assert wf.root_id == first
    assert crafted.id not in {m.record.task_id for m in wf.members}
    jobbers.cancel_workflow(res.id)
    _settled(jobbers, first, 1, W.CANCELLED)


def test_resubmit_workflow_resubmits_the_failed_members(jobbers: Jobbers) -> None:
    res = group(add.s(1, 1), boom.s()).apply_async()
    wf = _settled(jobbers, res.id, 2, W.FAILED)
    failed = wf.blocking
    assert jobbers.resubmit_workflow(res.id) == failed
    wf = _settled(jobbers, res.id, 2, W.FAILED)  # it fails again (boom always does)
    assert any(t.reason.endswith("resubmitted") and t.task_id == failed[0]
               for t in wf.history)
    assert wf.members[1].record.attempt == 2 or wf.members[0].record.attempt == 2


def test_an_ended_workflow_is_not_cancelled(jobbers: Jobbers) -> None:
    res = group(add.s(1, 1), add.s(2, 2)).apply_async()
    assert res.get(timeout=10) == [2, 4]
    _settled(jobbers, res.id, 2, W.COMPLETED)
    assert jobbers.cancel_workflow(res.id) == []
    late = add.apply_async((3, 3), group_id=res.id)  # not cancelled: nothing was marked
    assert late.get(timeout=10) == 6
    assert _settled(jobbers, res.id, 3, W.COMPLETED).history[-1].task_id == late.id


def test_a_dead_letter_resubmitted_after_its_record_expired_rejoins_its_workflow(
        jobbers: Jobbers) -> None:
    res = group(add.s(1, 1), boom.s()).apply_async()
    wf = _settled(jobbers, res.id, 2, W.FAILED)
    failed = wf.blocking[0]
    # written by the failing thread just after its failed step settled the workflow
    entry = wait_for(lambda: next((e for e in _sink(jobbers).entries if e.task_id == failed),
                                  None), message="the failed member's dead letter")
    assert jobbers.store.remove_terminal([failed]) == 1  # as if its record expired
    assert len(_settled(jobbers, res.id, 1, W.COMPLETED).members) == 1
    assert jobbers.resubmit_dead_letters([entry]) == [failed]
    wf = _settled(jobbers, res.id, 2, W.FAILED)  # it fails again, in its workflow
    assert failed in [m.record.task_id for m in wf.members]
    assert jobbers.get(failed).group_id == res.id  # type: ignore[union-attr]


def test_a_task_alone_is_a_workflow_of_one_and_unknown_ids_none(jobbers: Jobbers) -> None:
    res = add.delay(2, 2)
    assert res.get(timeout=10) == 4
    wf = _settled(jobbers, res.id, 1)
    assert wf.root_id == res.id
    assert wf.members[0].role == "root"
    assert wf.state is W.COMPLETED
    assert jobbers.workflow("no-such-id") is None
    assert jobbers.workflow("x" * (MAX_ID_CHARS + 1)) is None
    assert jobbers.cancel_workflow("a\udcff") == []
    assert jobbers.cancel_workflow("no-such-id") == []
    assert jobbers.resubmit_workflow("no-such-id") == []
    with pytest.raises(ValueError, match="limit"):
        jobbers.workflow(res.id, limit=0)


def test_limit_truncates_the_members(jobbers: Jobbers) -> None:
    res = group(add.s(i) for i in range(5)).apply_async()
    res.get(timeout=10)
    _settled(jobbers, res.id, 5)
    wf = jobbers.workflow(res.id, limit=2)
    assert wf is not None
    assert wf.truncated
    assert len(wf.members) == 2
    # the state and counts cover every member (counted in the store), not only those read
    assert (wf.state, wf.completed, wf.pending, wf.running) == (W.COMPLETED, 5, 0, 0)
    assert wf.total == 5


def test_a_plain_successor_does_not_hold_the_workflow_running(jobbers: Jobbers) -> None:
    """A chain's next step that is a plain Celery task is never recorded: the link before
    it completes the workflow."""
    res = chain(add.s(1, 1), plain.s()).apply_async()
    assert res.get(timeout=10) == 2
    wf = _settled(jobbers, res.parent.id, 1)
    assert wf.state is W.COMPLETED


def test_a_delayed_link_is_a_member_and_awaited(jobbers: Jobbers) -> None:
    """A chain's next step with a countdown waits in the store (a delayed first publish):
    it is recorded in the workflow as it is scheduled, and runs in it."""
    res = chain(add.s(1, 1), add.s(2).set(countdown=0.2), add.s(3)).apply_async()
    assert res.get(timeout=15) == 7
    wf = _settled(jobbers, res.id, 3)
    assert wf.state is W.COMPLETED
    delayed = wf.members[1]
    assert delayed.parent_id == wf.root_id
    assert [t.to_state for t in jobbers.history(delayed.record.task_id)][:2] == [
        S.SUBMITTED, S.SCHEDULED]


# ---------------------------------------------------------------------- pure: at publish
def _sig(task: str, task_id: str | None = None, **options: Any) -> dict[str, Any]:
    return {"task": task, "args": [], "kwargs": {}, "options": {"task_id": task_id, **options}}


def test_links_of_a_task_alone_are_empty() -> None:
    assert links("a", {"id": "a", "root_id": "a"}, ([], {}, {})) == {}


def test_links_of_canvas_members() -> None:
    # a top-level group member: its own root, the group's id
    assert links("a", {"root_id": "a", "group": "g"}, ([], {}, {})) == {
        "wf": "g", "root": "a", "grp": "g"}
    # a chord header member: the callback's id
    body = ([], {}, {"chord": _sig("t.sum", "cb")})
    assert links("a", {"root_id": "a", "group": "g"}, body)["chd"] == "cb"
    # a chain's first link: successors; a group of chains keeps the group on the last link
    first = ([], {}, {"chain": [_sig("t.add", "c", group_id="g"), _sig("t.add", "b")]})
    assert links("a", {"root_id": "a"}, first) == {"wf": "g", "root": "a", "nxt": "1",
                                                   "end": "c"}
    # a later link joins its parent's workflow
    assert links("b", {"root_id": "a", "parent_id": "a"}, ([], {}, {}), inherited="g") == {
        "wf": "g", "root": "a", "par": "a"}
    # its own header wins (a retry keeps its workflow)
    assert links("b", {"root_id": "a", "parent_id": "a", HEADER_WORKFLOW: "k"}, ([], {}, {}),
                 inherited="g")["wf"] == "k"


def test_successors_that_are_plain_tasks_are_not_awaited() -> None:
    def tracked(name: str) -> bool:
        return name != "t.plain"
    body = ([], {}, {"chain": [_sig("t.plain", "b")], "chord": _sig("t.plain", "cb")})
    assert links("a", {"root_id": "a"}, body, tracked=tracked) == {}
    nested = ([], {}, {"chain": [{"task": "celery.chord", "options": {"task_id": "c"},
                                  "kwargs": {"header": [_sig("t.plain"), _sig("t.add")],
                                             "body": _sig("t.plain")}}]})
    assert links("a", {"root_id": "a"}, nested, tracked=tracked)["nxt"] == "1"


@pytest.mark.parametrize("bad", ["x" * (MAX_ID_CHARS + 1), "a\udcff", 42, "", None, ["a"]])
def test_ids_from_a_message_are_bounded(bad: Any) -> None:
    fields = links("a", {"root_id": bad, "parent_id": bad, "group": bad}, ([], {}, {}))
    assert fields == {}
    assert workflow_key("a", bad, bad, [_sig("t", "x", group_id=bad)], bad) == "a"


def test_links_never_trust_the_body_shape() -> None:
    for body in (None, b"raw", [], ({}, {}, "embed"), ([], {}, {"chain": "x", "chord": 3,
                                                              "callbacks": {"a": 1}})):
        assert links("a", {"root_id": "a"}, body) == {}


def _published_by(task: Any, request: dict[str, Any], headers: dict[str, Any]) -> dict[str, str]:
    """``payload.workflow_of`` of a message published while ``task`` runs ``request``."""
    from celery._state import _task_stack

    from jobbers_celery.lifecycle.payload import workflow_of
    task.push_request(called_directly=False, **request)
    _task_stack.push(task)
    try:
        return workflow_of(app, {"id": "m", **headers}, ([], {}, {}))
    finally:
        _task_stack.pop()
        task.pop_request()


def test_what_a_running_task_publishes_joins_its_workflow() -> None:
    # a chain's next step, published by a link of workflow "k" (its header)
    assert _published_by(add, {"id": "p", "root_id": "r", HEADER_WORKFLOW: "k"},
                         {"root_id": "r", "parent_id": "p"})["wf"] == "k"
    # a chord's callback, published by the header member that completed last (its own
    # root, the group's id names the workflow): the group, not that member
    assert _published_by(add, {"id": "p", "root_id": "p", "group": "g"},
                         {"root_id": "p", "parent_id": "p", "group": "g"})["wf"] == "g"
    # a message it does not parent (published with another parent_id) keeps its own
    assert _published_by(add, {"id": "p", "root_id": "p", HEADER_WORKFLOW: "k"},
                         {"root_id": "x", "parent_id": "y"})["wf"] == "x"


def test_a_chord_callback_chord_unlock_publishes_joins_the_header_group() -> None:
    """With a result backend that counts no parts, Celery's plain ``chord_unlock`` task
    publishes the callback, as its root and parent (checked on Celery 5.7)."""
    assert _published_by(plain, {"id": "u", "root_id": "u"},
                         {"root_id": "u", "parent_id": "u", "group": "g"})["wf"] == "g"
    # nested in a chain: the chain's root names it
    assert _published_by(plain, {"id": "u", "root_id": "r"},
                         {"root_id": "r", "parent_id": "u", "group": "g"})["wf"] == "r"
    # a task a plain task publishes joins the plain task's workflow
    assert _published_by(plain, {"id": "u", "root_id": "u"},
                         {"root_id": "u", "parent_id": "u"})["wf"] == "u"


# ---------------------------------------------------------------------- pure: on read
T0 = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)


def _member(task_id: str, states: list[S], *, at: int = 0, parent: str | None = None,
            chord: str | None = None, successors: bool = False,
            group: str | None = None) -> MemberRead:
    history, before = [], S.UNSUBMITTED
    for n, state in enumerate(states):
        history.append(Transition(task_id, before, state, T0 + timedelta(seconds=at + n), 1,
                                  None, None))
        before = state
    record = TaskRecord(task_id, "t", 1, "q", states[-1], 1, 0, T0 + timedelta(seconds=at),
                        None, None, history[-1].at if states[-1] in
                        (S.COMPLETED, S.FAILED, S.CANCELLED) else None, None, None, None, None,
                        None, None, root_id="r", parent_id=parent, group_id=group)
    return MemberRead(record, history, chord=chord, successors=successors)


def test_a_completed_link_awaits_its_successor() -> None:
    read = WorkflowRead("r", [_member("r", [S.SUBMITTED, S.STARTED, S.COMPLETED],
                                      successors=True)], 1)
    wf = derive(read, T0 + timedelta(seconds=10))
    assert wf.state is W.RUNNING
    assert wf.pending == 1
    assert wf.total == 2
    assert wf.elapsed == timedelta(seconds=10)
    assert wf.ended_at is None
    done = WorkflowRead("r", [*read.members, _member("n", [S.SUBMITTED, S.STARTED,
                                                           S.COMPLETED], at=3, parent="r")], 2)
    wf = derive(done, T0 + timedelta(seconds=10))
    assert wf.state is W.COMPLETED
    assert wf.pending == 0
    assert wf.total == 2
    assert wf.ended_at == T0 + timedelta(seconds=5)
    assert wf.elapsed == timedelta(seconds=5)
    assert [t.state for t in wf.history] == [W.RUNNING, W.COMPLETED]


def test_a_chord_callback_is_awaited_until_a_header_member_fails() -> None:
    ok = _member("a", [S.SUBMITTED, S.STARTED, S.COMPLETED], chord="cb", group="g")
    running = _member("b", [S.SUBMITTED, S.STARTED], chord="cb", group="g")
    wf = derive(WorkflowRead("g", [ok, running], 2), T0)
    assert wf.state is W.RUNNING
    assert wf.pending == 1
    assert wf.blocking == ["b"]
    failed = _member("b", [S.SUBMITTED, S.STARTED, S.FAILED], chord="cb", group="g")
    wf = derive(WorkflowRead("g", [ok, failed], 2), T0)
    assert wf.state is W.FAILED
    assert wf.pending == 0
    assert wf.blocking == ["b"]
    assert [t.reason for t in wf.history] == ["t[a] submitted", "member t[b] failed"]
    # resubmitted, it completes: the callback runs
    again = _member("b", [S.SUBMITTED, S.STARTED, S.FAILED, S.SUBMITTED, S.STARTED,
                          S.COMPLETED], chord="cb", group="g")
    cb = _member("cb", [S.SUBMITTED, S.STARTED, S.COMPLETED], at=10, parent="b", group="g")
    wf = derive(WorkflowRead("g", [ok, again, cb], 3), T0)
    assert wf.state is W.COMPLETED
    assert wf.history[-1].reason == "callback t[cb] ran: completed"
    assert any(t.reason == "member t[b] resubmitted" for t in wf.history)


def test_cancelled_workflows_end_cancelled_with_their_mark() -> None:
    members = [_member("a", [S.SUBMITTED, S.CANCELLED]),
               _member("b", [S.SUBMITTED, S.STARTED, S.COMPLETED])]
    wf = derive(WorkflowRead("g", members, 2, cancelled_at=T0 + timedelta(seconds=1)), T0)
    assert wf.state is W.CANCELLED
    assert wf.cancelled == 1
    assert wf.blocking == []
    assert any(t.reason == "cancelled by request" and t.task_id is None for t in wf.history)


def test_a_big_chord_is_derived_in_one_pass() -> None:
    """3,000 header members and their callback: the replay is linear in the events (a pass
    over the members per event took 12 s for 10,000 members)."""
    heads = [_member(f"h{i}", [S.SUBMITTED, S.STARTED, S.COMPLETED], chord="cb", group="g")
             for i in range(3000)]
    wf = derive(WorkflowRead("g", heads, 3000), T0)
    assert (wf.state, wf.pending, wf.total, wf.completed) == (W.RUNNING, 1, 3001, 3000)
    assert wf.blocking == ["cb"]  # the callback, expected and not recorded yet
    cb = _member("cb", [S.SUBMITTED, S.STARTED, S.COMPLETED], at=9, parent="h1", group="g")
    wf = derive(WorkflowRead("g", [*heads, cb], 3001), T0)
    assert (wf.state, wf.pending, wf.total) == (W.COMPLETED, 0, 3001)
    assert [t.state for t in wf.history] == [W.RUNNING, W.COMPLETED]


def test_members_of_one_millisecond_come_parents_first() -> None:
    """The index orders members by submission time, then by id: a chain's links published
    in the same millisecond are listed parents first."""
    links_ = [_member(f"{9 - i}", [S.SUBMITTED, S.STARTED, S.COMPLETED],
                      parent=f"{10 - i}" if i else None, successors=i < 4) for i in range(5)]
    wf = derive(WorkflowRead("9", sorted(links_, key=lambda m: m.record.task_id), 5), T0)
    assert [m.record.task_id for m in wf.members] == ["9", "8", "7", "6", "5"]
    assert [m.role for m in wf.members] == ["root", "member", "member", "member", "member"]
    assert wf.state is W.COMPLETED


def test_a_workflow_fails_once_nothing_is_left_to_run() -> None:
    slow = _member("a", [S.SUBMITTED, S.STARTED, S.STARTED, S.STARTED, S.COMPLETED])
    bad = _member("b", [S.SUBMITTED, S.STARTED, S.FAILED])
    wf = derive(WorkflowRead("g", [slow, bad], 2), T0)
    assert [(t.state, t.reason, t.task_id) for t in wf.history] == [
        (W.RUNNING, "t[a] submitted", "a"),
        (W.RUNNING, "member t[b] failed", "b"),
        (W.FAILED, "t[a] ended, nothing left to run: failed (t[b] failed)", "a")]
    assert wf.blocking == ["b"]
    assert wf.ended_at == T0 + timedelta(seconds=4)


def test_hostile_canvases_are_walked_within_bounds() -> None:
    """A message may name a million callbacks, or nest groups in chords without end: the
    walk for tracked successors looks at MAX_SUCCESSOR_SIGNATURES of them at most."""
    def only_real(name: str) -> bool:
        return name == "t.real"
    many = [_sig("t.plain")] * 1_000_000 + [_sig("t.real")]
    assert "nxt" not in links("a", {"root_id": "a", "group": "g"},
                              ([], {}, {"callbacks": many}), tracked=only_real)
    deep: dict[str, Any] = _sig("t.real")
    for _ in range(10_000):
        deep = {"task": "celery.chord", "kwargs": {"header": [deep] * 3, "body": deep}}
    assert links("a", {"root_id": "a", "group": "g"}, ([], {}, {"chain": [deep]}),
                 tracked=only_real).get("nxt") in (None, "1")


def test_a_workflow_read_in_part_goes_by_the_states_of_all_its_members() -> None:
    done = [_member(f"m{i}", [S.SUBMITTED, S.STARTED, S.COMPLETED], group="g")
            for i in range(3)]
    beyond = {S.COMPLETED: 3, S.STARTED: 2, S.SUBMITTED: 5}
    wf = derive(WorkflowRead("g", done, 10, truncated=True, states=beyond), T0)
    assert (wf.state, wf.total, wf.completed, wf.running, wf.pending) == (
        W.RUNNING, 10, 3, 2, 5)
    assert wf.ended_at is None
    failed = {S.COMPLETED: 9, S.STALLED: 1}
    wf = derive(WorkflowRead("g", done, 10, truncated=True, states=failed), T0)
    assert (wf.state, wf.failed, wf.completed) == (W.FAILED, 1, 9)
