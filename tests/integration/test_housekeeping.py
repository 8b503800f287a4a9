"""The workers' housekeeping keeps the indexes from growing: it drains every expired record."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from jobbers_celery.scheduler import Scheduler
from jobbers_celery.states import TaskState as S
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
    keys = store.keys
    for index in (keys.all_tasks, keys.name_index("hk.task"), keys.state_index(S.COMPLETED)):
        assert store.client.zcard(index) == 0
    assert store.client.exists(keys.task("t0"), keys.task("t1199")) == 0


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
    assert store.client.zscore(store.keys.publishing, "orphan") is None
