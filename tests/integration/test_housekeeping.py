"""The workers' housekeeping keeps the indexes from growing: it drains every expired record."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from jobbers_celery.core.states import TaskState as S
from jobbers_celery.lifecycle.scheduler import Scheduler
from jobbers_celery.store import RedisStore
from tests.conftest import wait_for

pytestmark = pytest.mark.redis


def _completed(store: RedisStore, task_id: str) -> None:
    store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,), name="hk.task",
               create={"name": "hk.task", "queue": "q"})
    store.step(task_id, S.STARTED, start=True)
    store.step(task_id, S.COMPLETED, fence=1)


def test_housekeeping_prunes_more_than_one_batch_and_only_once_at_a_time(redis_url):
    store = RedisStore.from_url(redis_url, retention=1)
    for i in range(1200):  # more than two prune batches of 500
        _completed(store, f"t{i}")
    dead_letters: Any = types.SimpleNamespace(retry_pending=lambda: 0)
    config: Any = None  # housekeeping reads no setting
    first, second = (Scheduler(store, config, None, dead_letters),  # type: ignore[arg-type]
                     Scheduler(store, config, None, dead_letters))  # type: ignore[arg-type]
    cutoff_passed = store.now_ms() + 1100
    wait_for(lambda: store.now_ms() > cutoff_passed, timeout=5, message="retention to pass")

    assert first.housekeeping() == 1200
    assert second.housekeeping() == 0  # the other worker skips while the lock is held
    for keys in store.shards.keys:
        for index in (keys.all_tasks, keys.name_index("hk.task"),
                      keys.state_index(S.COMPLETED)):
            assert store.client.zcard(index) == 0
    assert store.get_raw("t0") == store.get_raw("t1199") == {}


def test_an_unsubmitted_record_whose_publisher_died_is_published_by_a_scheduler(
        proj) -> None:
    # An immediate retry or a shutdown resubmit records started -> unsubmitted with a
    # publish lease, then publishes; if its process dies in between, a scheduler publishes
    # the recorded payload once the lease has expired: the task is not lost.
    jobbers = proj.jobbers
    store = jobbers.store
    msg = json.dumps({"args": [2, 3], "kwargs": {}, "options": {}})
    store.step("orphan", S.SUBMITTED, sources=(S.UNSUBMITTED,), create={"name": "proj.add"},
               set_fields={"msg": msg}, name="proj.add")
    assert store.step("orphan", S.STARTED, start=True, worker="w@x").applied
    res = store.step("orphan", S.UNSUBMITTED, fence=1, worker="w@x", reason="retry 1 of 3",
                     set_fields={"retries": "1"}, lease_ms=1)
    assert res.applied  # ... and the process dies here, before publishing
    done = res.now_ms
    wait_for(lambda: store.now_ms() > done + 2, timeout=5, interval=0.001,
             message="the 1 ms lease to expire")
    published, _ = jobbers.scheduler("sched@x").run_once()
    assert published == 1
    assert store.get("orphan").state == S.SUBMITTED
    assert store.history("orphan")[-1].reason == "published by a scheduler: its publisher did not"
    [message] = store.client.lrange("celery", 0, -1)
    assert json.loads(message)["headers"]["id"] == "orphan"
    assert json.loads(message)["headers"]["retries"] == 1
    assert store.client.zscore(store.keys_of("orphan").publishing, "orphan") is None


def test_housekeeping_samples_the_counts_once_a_minute_into_a_capped_history(redis_url):
    from jobbers_celery import CountSample
    from jobbers_celery.telemetry.history import CountHistory

    store = RedisStore.from_url(redis_url)
    _completed(store, "done-1")
    dead_letters: Any = types.SimpleNamespace(retry_pending=lambda: 0)
    config: Any = None
    history = CountHistory(store, keep=3)
    workers = [Scheduler(store, config, None, dead_letters,  # type: ignore[arg-type]
                         history=history) for _ in range(2)]

    def minute() -> int:
        now = store.now_ms()
        return now - now % 60_000

    before = minute()
    # five older minutes, as earlier passes left them
    store.client.zadd(store.keys.count_history, {
        json.dumps({"at": before - m * 60_000, "counts": {"completed": 10 + m}}):
        before - m * 60_000 for m in range(1, 6)})
    for scheduler in workers:  # two workers' passes
        scheduler.housekeeping()
    # the newest three are kept: this minute's sample and two older ones
    assert store.client.zcard(store.keys.count_history) == 3
    samples = history.read(minutes=10)
    if minute() == before:  # the same minute (almost always): one sample between both
        assert [s.counts[S.COMPLETED] for s in samples] == [12, 11, 1]
    sample = samples[-1]
    assert isinstance(sample, CountSample)
    assert (sample.counts[S.COMPLETED], sample.counts[S.STARTED]) == (1, 0)
    assert int(sample.at.timestamp() * 1000) % 60_000 == 0
    assert history.read(minutes=1)[-1] == sample  # ``minutes`` bounds what is read
    assert len(history.read(minutes=1)) <= 2
    with pytest.raises(ValueError, match="at least 1"):
        history.read(minutes=0)


@pytest.mark.worker
def test_a_running_worker_samples_the_counts_for_count_history(proj, worker_factory):
    # Jobbers.scheduler() gives the worker's scheduler thread the count history: its first
    # housekeeping pass takes this minute's sample, read back through the public API
    assert proj.jobbers.count_history(5) == []
    worker_factory(pool="solo", concurrency=1)
    wait_for(lambda: proj.jobbers.count_history(5), timeout=20,
             message="the worker's first count sample")
    [sample] = proj.jobbers.count_history(5)[-1:]
    assert set(sample.counts) == set(S)
