"""A pass that recovers more than it can republish within its budget hands the rest to the
workers' schedulers: the pass stays short, and every recovered task still runs once."""

from __future__ import annotations

from jobbers_celery import TaskState
from jobbers_celery.lifecycle.cleaner import Cleaner
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import wait_state
from tests.integration.stall_helpers import fabricate, ticking

S = TaskState


def test_recovered_tasks_beyond_the_publish_budget_are_published_by_worker_schedulers(
        proj, worker_factory, monkeypatch):
    jobbers = proj.jobbers
    store = jobbers.store
    ids = [f"handover-{i:02d}" for i in range(40)]
    with ticking(store) as wid:
        fabricate(store, ids, wid=wid, hb_ms=1, srec=1)  # heartbeat overdue at once
        done_ms = store.now_ms()
        wait_for(lambda: store.now_ms() > done_ms + 2, timeout=5, interval=0.001,
                 message="the 1 ms heartbeat deadlines to pass (Redis clock)")
        # a publish budget of 0: hand everything over
        report = Cleaner(store, jobbers.config, jobbers.recorder, jobbers.publisher,
                         publish_budget_s=0.0).run(by="clean()")
    assert report.stalled == 40
    assert sorted(report.recovered) == ids
    assert store.client.llen("celery") == 0  # nothing published by the pass itself
    for task_id in ids:
        assert store.get(task_id).state == S.SUBMITTED
        assert store.client.zscore(store.keys_of(task_id).publishing, task_id) == 0  # due for anyone

    worker = worker_factory(pool="threads", concurrency=4)  # its scheduler publishes them
    for task_id in ids:
        record = wait_state(jobbers, task_id, S.COMPLETED, timeout=30, worker=worker)
        assert record.attempt == 2
        starts = [t for t in jobbers.history(task_id) if t.to_state == S.STARTED]
        assert len(starts) == 2  # the fabricated attempt and exactly one recovery
    assert sum(store.client.zcard(k.publishing) for k in store.shards.keys) == 0
