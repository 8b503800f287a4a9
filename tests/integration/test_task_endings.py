"""``self.replace()`` on real workers, in every pool, as a plain ``celery.Task`` and as a
``JobbersTask`` side by side (tests/integration/replace_proj.py): the caller gets the same
result, and the record follows the replaced id to the task that took it.

- alone: ``replace(add.s(x, 100))``: 101;
- in a chain: ``add.s(1, 1) | replaced.s() | add.s(1)``: 103;
- by a group: Celery makes it a chord whose body, ``celery.accumulate``, takes the id:
  ``[x + 1, x + 2]``;
- by a chain: its last task takes the id, and is published when the chain reaches it.

And two endings Celery reports from the worker's main process after the pool process ran the
task: ``Reject(requeue=False)`` (the task recorded ``failed`` itself) and a hard time limit
(reported twice by Celery): the same FAILURE for the caller, the record ``failed``, and no
refused transition in the worker's log.

And the store's part of a replace, on Redis and on the in-memory store alike: only a
record the replace step marked takes the name and queue of the task published with its id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, chain

from jobbers_celery import TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.store import RedisStore
from jobbers_celery.testing import InMemoryStore
from tests.conftest import RedisServer, Worker, start_worker, wait_for
from tests.integration.replace_proj import make_app

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
POOLS = ["prefork", "solo", "threads", "gevent", "eventlet"]
#: Databases of the session's Redis the two apps use (the redis_url fixture's is 0).
DBS = {"plain": 13, "jobbers": 14}


@pytest.fixture
def urls(redis_server: RedisServer) -> Iterator[dict[str, str]]:
    base = redis_server.url().rsplit("/", 1)[0]
    found = {kind: f"{base}/{db}" for kind, db in DBS.items()}
    _flush(found.values())
    yield found
    _flush(found.values())


def _flush(urls: Iterable[str]) -> None:
    for url in urls:
        with redis.Redis.from_url(url) as client:
            client.flushdb()


def _scenarios(app: Celery) -> dict[str, tuple[Any, str, str]]:
    """Each scenario's (result, Celery's state, the replaced task's id)."""
    t = app.tasks
    out: dict[str, tuple[Any, str, str]] = {}
    alone = t["rp.replaced"].delay(1)
    out["alone"] = (alone.get(timeout=20), alone.state, alone.id)
    last = chain(t["rp.add"].s(1, 1), t["rp.replaced"].s(), t["rp.add"].s(1)).delay()
    value = last.get(timeout=20)
    out["in a chain"] = (value, last.state, last.parent.id)
    fan = t["rp.fan"].delay(1)
    out["by a group"] = (fan.get(timeout=20), fan.state, fan.id)
    chained = t["rp.chained"].delay(1)
    out["by a chain"] = (chained.get(timeout=20), chained.state, chained.id)
    return out


def _steps(jobbers: Jobbers, task_id: str) -> list[tuple[TaskState, str | None]]:
    return [(t.to_state, t.reason) for t in jobbers.history(task_id)]


def _ended(jobbers: Jobbers, task_id: str, state: TaskState = S.COMPLETED) -> Any:
    def done() -> Any:
        record = jobbers.get(task_id)
        return record if record is not None and record.state is state else None
    return wait_for(done, message=f"{task_id} {state}")


def _logged(worker: Worker, text: str) -> None:
    wait_for(lambda: text in worker.log, timeout=20, message=repr(text))


@pytest.mark.parametrize("pool", POOLS)
def test_replace_in_every_pool(pool: str, urls: dict[str, str], tmp_path: Path) -> None:
    seen: dict[str, dict[str, tuple[Any, str]]] = {}
    for kind, url in urls.items():
        app = make_app(kind, url)
        worker = start_worker(app, "tests.integration.replace_proj", tmp_path, pool=pool,
                              env={"REPLACE_PROJ_KIND": kind, "REPLACE_PROJ_URL": url})
        try:
            results = _scenarios(app)
            seen[kind] = {name: (value, state) for name, (value, state, _) in results.items()}
            if kind == "jobbers":
                _check_records(Jobbers.of(app), results)
        finally:
            worker.stop()
            _close(app)
        assert "refused transition" not in worker.log
        assert "duplicate or stale delivery" not in worker.log
    assert seen["jobbers"] == seen["plain"] == {
        "alone": (101, "SUCCESS"), "in a chain": (103, "SUCCESS"),
        "by a group": ([2, 3], "SUCCESS"), "by a chain": (12, "SUCCESS")}


def _close(app: Celery) -> None:
    """The client app's connections (a socket left open fails the session)."""
    jobbers = Jobbers.find(app)
    if jobbers is not None:
        jobbers.store.client.close()
    app.backend.client.connection_pool.disconnect()
    app.close()


def _check_records(jobbers: Jobbers, results: dict[str, tuple[Any, str, str]]) -> None:
    for name in ("alone", "in a chain"):
        task_id = results[name][2]
        record = _ended(jobbers, task_id)
        assert (record.name, record.attempt) == ("rp.add", 2), name
        assert _steps(jobbers, task_id)[1:] == [
            (S.STARTED, None), (S.UNSUBMITTED, "replaced by rp.add"),
            (S.SUBMITTED, "published"), (S.STARTED, None), (S.COMPLETED, None)], name
    task_id = results["by a group"][2]
    record = _ended(jobbers, task_id)
    assert record.name == "rp.fan"  # celery.accumulate, a plain task, took the id
    assert _steps(jobbers, task_id)[-1] == (
        S.COMPLETED,
        "replaced by celery.accumulate (not tracked: Celery's result tells its outcome)")
    task_id = results["by a chain"][2]
    record = _ended(jobbers, task_id)
    assert (record.name, record.attempt) == ("rp.add", 2)
    assert [s for s, _ in _steps(jobbers, task_id)] == [
        S.SUBMITTED, S.STARTED, S.UNSUBMITTED, S.SUBMITTED, S.STARTED, S.COMPLETED]


def test_reject_and_hard_time_limit_log_no_refusal(urls: dict[str, str],
                                                   tmp_path: Path) -> None:
    seen: dict[str, dict[str, tuple[str, str]]] = {}
    for kind, url in urls.items():
        app = make_app(kind, url)
        worker = start_worker(app, "tests.integration.replace_proj", tmp_path, pool="prefork",
                              env={"REPLACE_PROJ_KIND": kind, "REPLACE_PROJ_URL": url})
        try:
            results = {"reject": app.tasks["rp.rejected"].delay(),
                       "hard limit": app.tasks["rp.hard_limit"].delay()}
            seen[kind] = {}
            for name, result in results.items():
                with pytest.raises(Exception) as caught:  # noqa: PT011 - compared below
                    result.get(timeout=20)
                seen[kind][name] = (result.state, type(caught.value).__name__)
            if kind == "jobbers":
                jobbers = Jobbers.of(app)
                for name, reason in (("reject", "rejected"),
                                     ("hard limit", "TimeLimitExceeded reported by the worker")):
                    task_id = results[name].id
                    _ended(jobbers, task_id, S.FAILED)
                    assert _steps(jobbers, task_id)[-1] == (S.FAILED, reason)
                # the pool process the limit interrupted tries its own end after the main
                # process recorded the failure: wait until it is gone
                _logged(worker, "exited with 'signal 9")
        finally:
            worker.stop()
            _close(app)
        assert "refused transition" not in worker.log
    assert seen["jobbers"] == seen["plain"] == {
        "reject": ("FAILURE", "Reject"), "hard limit": ("FAILURE", "TimeLimitExceeded")}


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_only_a_replaced_record_takes_the_name_it_is_published_under(
        kind: str, make_store: Callable[..., RedisStore]) -> None:
    store: Any = make_store() if kind == "redis" else InMemoryStore()
    for task_id, mark in (("replaced", {"rpl": "1"}), ("other", {})):
        store.step(task_id, S.SUBMITTED, create={"name": "old.name", "queue": "q1", "dlq": "1"},
                   reason="published", name="old.name")
        store.step(task_id, S.STARTED, start=True, wid="w1", name="old.name")
        store.step(task_id, S.UNSUBMITTED, fence=1, set_fields=mark, wid="w1",
                   name="old.name", reason="replaced by new.name")
        res = store.step(task_id, S.SUBMITTED, create={"name": "new.name", "queue": "q2"},
                         set_fields={"msg": "{}"}, name="new.name", reason="published")
        assert res.applied
    replaced, other = store.get("replaced"), store.get("other")
    assert (replaced.name, replaced.queue, other.name, other.queue) == (
        "new.name", "q2", "old.name", "q1")
    if kind == "redis":
        raw = store.client.hgetall(store.keys_of("replaced").task("replaced"))
        assert "rpl" not in raw
        assert "dlq" not in raw  # the new task saves no dead letters
        index = store.keys_of("replaced").name_index("new.name")
        assert store.client.zscore(index, "replaced") is not None
        assert [r.task_id for r in store.tasks(name="new.name")] == ["replaced"]
        assert [r.task_id for r in store.tasks(name="old.name")] == ["other"]
