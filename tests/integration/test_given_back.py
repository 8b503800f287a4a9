"""The ``jobbers_given_back`` header is a claim, never proof: a copied or crafted message
naming the worker that runs a task does not take its attempt over (the task runs once),
while a real give-back (a start recorded for a live worker that never ran it, its reply lost
in an outage) still runs the task once. Real workers, the session's private Redis.

The given-back tests of a store outage (tests/integration/test_store_outage.py) cover a
giver that is gone."""

from __future__ import annotations

import uuid
from typing import Any

from jobbers_celery import TaskState, get_jobbers
from jobbers_celery.lifecycle import publisher
from jobbers_celery.store import Giver
from jobbers_celery.worker.task import HEADER_GIVEN_BACK
from tests.conftest import wait_for

S = TaskState


def _runs(jobbers: Any, key: str) -> list[str]:
    """The executions of ``proj.record_run``'s body, as it appended them."""
    from tests.integration import proj

    client: Any = proj._redis()  # type: ignore[no-untyped-call]

    return [str(v) for v in client.lrange(key, 0, -1)]


def _publish_given_back(proj: Any, task_id: str, key: str, seconds: float,
                        header: str) -> None:
    """Publish a message of ``task_id`` with the header, as a worker gives one back (no
    record is made)."""
    with publisher.unrecorded_publish():
        proj.record_run.apply_async((key, seconds), task_id=task_id, ignore_result=True,
                                    headers={HEADER_GIVEN_BACK: header})


def test_a_crafted_given_back_copy_does_not_take_over_a_running_attempt(
        proj: Any, worker_factory: Any) -> None:
    worker = worker_factory(concurrency=2)  # a free slot for the copy while the task runs
    jobbers = get_jobbers(proj.app)
    task_id, key = uuid.uuid4().hex, f"crafted:{uuid.uuid4().hex}"
    proj.record_run.apply_async((key, 8.0), task_id=task_id, ignore_result=True)
    wait_for(lambda: len(_runs(jobbers, key)) == 1, message="the task to run")
    wid = jobbers.store.get_raw(task_id)["wid"]  # the live worker incarnation running it
    _publish_given_back(proj, task_id, key, 8.0, f"{wid}/0")

    wait_for(lambda: (r := jobbers.get(task_id)) is not None and r.state is S.COMPLETED,
             timeout=30, message="the task to complete")
    assert _runs(jobbers, key) == [f"{task_id}:1"]  # ran once, by the first delivery
    wait_for(lambda: "which is alive and runs it" in worker.log
             or f"not running proj.record_run[{task_id}]: it is completed" in worker.log,
             timeout=15, message="the copy to be refused")
    assert _runs(jobbers, key) == [f"{task_id}:1"]
    record = jobbers.get(task_id)
    assert record is not None
    assert record.attempt == 1
    steps = [(t.from_state, t.to_state) for t in jobbers.history(task_id)]
    assert (S.STARTED, S.UNSUBMITTED) not in steps, steps
    assert steps[-2:] == [(S.SUBMITTED, S.STARTED), (S.STARTED, S.COMPLETED)], steps


def test_a_real_give_back_to_a_live_giver_still_runs_the_task_once(
        proj: Any, worker_factory: Any) -> None:
    worker_factory(concurrency=2)
    jobbers = get_jobbers(proj.app)
    store = jobbers.store
    warm = uuid.uuid4().hex
    proj.add.apply_async((1, 1), task_id=warm)
    wait_for(lambda: (r := jobbers.get(warm)) is not None and r.state is S.COMPLETED,
             message="the worker to start")
    [(wid, _, _)] = store.workers(0)  # the live worker's incarnation
    # its start of the task was recorded, its reply lost in an outage: the task never ran
    # there, and the worker gave the message back naming itself
    task_id, key = uuid.uuid4().hex, f"given:{uuid.uuid4().hex}"
    assert store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                      create={"name": "proj.record_run", "queue": "celery"},
                      name="proj.record_run").applied
    assert store.step(task_id, S.STARTED, start=True, wid=wid,
                      worker="proj-worker@localhost").applied
    _publish_given_back(proj, task_id, key, 0.0, f"{wid}/0")

    wait_for(lambda: (r := jobbers.get(task_id)) is not None and r.state is S.COMPLETED,
             timeout=30, message="the given-back task to complete")
    assert _runs(jobbers, key) == [f"{task_id}:2"]  # once, as the next attempt
    history = jobbers.history(task_id)
    steps = [(t.from_state, t.to_state) for t in history]
    assert steps[-4:] == [(S.STARTED, S.UNSUBMITTED), (S.UNSUBMITTED, S.SUBMITTED),
                          (S.SUBMITTED, S.STARTED), (S.STARTED, S.COMPLETED)], steps
    # taken back on the live worker's own word (its liveness refresh reports the attempts
    # recorded there for longer than jobbers_worker_lost_after that it does not run), not
    # on the header's: not before that long after the start
    started, back = history[-5].at, history[-4].at
    lost = proj.app.conf.jobbers_worker_lost_after
    assert (back - started).total_seconds() >= lost, (started, back)


# ---------------------------------------------------------------- the step decides
def _started(store: Any, task_id: str, wid: str) -> None:
    assert store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                      create={"name": "proj.add", "queue": "celery"}, name="proj.add").applied
    assert store.step(task_id, S.STARTED, start=True, wid=wid, worker="w@h").applied


def _take_back(store: Any, task_id: str, wid: str, judge: Giver) -> Any:
    return store.end(task_id, S.UNSUBMITTED, fence=1, wid_fence=wid, wid=wid,
                     name="proj.add", worker="x@h", reason="taken back", giver=judge)


def test_the_store_takes_a_start_back_only_from_a_giver_gone_or_that_said_so(
        make_store: Any) -> None:
    store = make_store(prefix=f"gb{uuid.uuid4().hex[:6]}")
    live, ghost = "live@h:1:aaaaaa", "ghost@h:2:bbbbbb"
    waiting = Giver(gone_ms=60_000, settle_ms=3_600_000)
    settled = Giver(gone_ms=60_000, settle_ms=-60_000)  # its refresh had its chance
    _started(store, "t-live", live)
    store.alive(live, (2000, 10000), [], 60_000, running=["t-live"], orphan_ms=0)  # runs it
    res = _take_back(store, "t-live", live, waiting)
    assert (res.applied, res.why) == (False, "giver_alive")  # its refresh may still tell
    res = _take_back(store, "t-live", live, settled)
    assert (res.applied, res.why) == (False, "giver_runs_it")
    assert store.get_raw("t-live")["state"] == "started"
    store.alive(live, (2000, 10000), [], 60_000, running=[], orphan_ms=0)  # it does not
    res = _take_back(store, "t-live", live, settled)
    assert res.applied
    assert res.state is S.UNSUBMITTED
    _started(store, "t-ghost", ghost)  # its start entered it in the workers set, now ...
    assert not _take_back(store, "t-ghost", ghost, waiting).applied
    gone = Giver(gone_ms=-1, settle_ms=3_600_000)  # ... and it has not been seen since
    res = _take_back(store, "t-ghost", ghost, gone)
    assert res.applied
    assert res.state is S.UNSUBMITTED


def test_the_store_takes_a_stall_back_only_on_its_workers_own_word(make_store: Any) -> None:
    store = make_store(prefix=f"gs{uuid.uuid4().hex[:6]}")
    wid = "live@h:1:aaaaaa"
    store.alive(wid, (2000, 10000), [], 60_000)
    for task_id, kind in (("t-gone", "gone"), ("t-hb", "hb")):
        _started(store, task_id, wid)
        keys = store.shards.keys[store.shards.index(task_id)]
        store.client.hset(keys.task(task_id),
                          mapping={"hb_iv": "1", "hb_at": "1"})  # silent: a heartbeat verdict
        # silence counts from the clock's resumed_at, which a fresh store's first step sets
        # to now: a verdict in that same millisecond keeps the task (seen in a CI run)
        resumed = int(store.client.hget(keys.clock, "resumed_at") or 0)
        wait_for(lambda r=resumed: store.now_ms() > r + 1, timeout=5, interval=0.001,
                 message="a millisecond past resumed_at")
        assert store.stall([(task_id, kind, wid, "proj.add")], 60_000, 5_000).stalled == 1
    for task_id, applied in (("t-hb", False), ("t-gone", True)):
        res = store.step(task_id, S.SUBMITTED, sources=(S.STALLED,), fence=1, wid_fence=wid,
                         gone_fence=True, name="proj.add", reason="taken back")
        assert res.applied is applied, (task_id, res)
    assert store.get_raw("t-hb")["state"] == "stalled"
