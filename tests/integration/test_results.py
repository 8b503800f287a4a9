"""Celery's result write folded into the ``completed`` step, and the normal path beside it.

The proj app stores results on the jobbers Redis server and db, so its workers fold the write;
a worker started with ``PROJ_RESULT_BACKEND`` on another db of that server folds it too (the
script selects the db); on another server or another kind of backend it must not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from jobbers_celery import TaskState
from tests.conftest import RedisServer, wait_for
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    POOLS,
    PUBLISH,
    START,
    path,
    transitions,
    wait_state,
)

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
FOLDED = "JobbersTask results are written by the completed step"
UNFOLDED = "JobbersTask results are written by Celery's backend"
OTHER_DB = 2


@pytest.fixture
def other_db(redis_server: RedisServer) -> Iterator[str]:
    """Another (clean) db on the session's Redis server."""
    url = redis_server.url(OTHER_DB)
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def reader(backend_url: str) -> Celery:
    """A client app reading results where a differently configured worker stores them."""
    return Celery("reader", broker="memory://", backend=backend_url, set_as_current=False)


def stored_meta(client: Any, task_id: str) -> dict[str, Any] | None:
    raw = client.get(f"celery-task-meta-{task_id}")
    return json.loads(raw) if raw else None


def refused_completions(jobbers: Any) -> int:
    return int(jobbers.store.refused_counts().get("refused:started>completed", 0))


@pytest.mark.parametrize("pool", POOLS)
def test_folded_result_is_readable_and_the_record_completed(proj, worker_factory, pool):
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool=pool, concurrency=2)
    results = [proj.add.delay(i, 1) for i in range(5)]
    assert [r.get(timeout=20) for r in results] == [i + 1 for i in range(5)]
    for r in results:
        record = wait_state(jobbers, r.id, S.COMPLETED, worker=worker)
        assert record.attempt == 1
        assert path(jobbers, r.id) == PUBLISH + START + COMPLETE
        # The record is completed no later than the result is visible (one script).
        meta = stored_meta(client, r.id)
        assert meta is not None
        assert meta["status"] == "SUCCESS"
        assert meta["task_id"] == r.id
        assert meta["date_done"]
        assert meta["children"] == []
        assert 0 < client.ttl(f"celery-task-meta-{r.id}") <= 86400  # result_expires
        assert "msg" not in jobbers.store.get_raw(r.id)
    assert FOLDED in worker.log
    assert UNFOLDED not in worker.log


def test_ignored_results_are_recorded_and_not_stored(proj, worker_factory):
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(concurrency=1)
    by_task = proj.ignored.delay(1)                            # ignore_result=True on the task
    by_call = proj.add.apply_async((1, 2), ignore_result=True)  # per call
    normal = proj.add.delay(2, 2)
    assert normal.get(timeout=20) == 4
    for r in (by_task, by_call):
        wait_state(jobbers, r.id, S.COMPLETED, worker=worker)
        assert path(jobbers, r.id) == PUBLISH + START + COMPLETE
        assert stored_meta(client, r.id) is None


@pytest.fixture
def other_server() -> Iterator[str]:
    """Another Redis server: results there cannot be folded."""
    server = RedisServer()
    yield server.url(0)
    server.stop()


def test_result_backend_on_another_db_is_folded_with_a_select(proj, worker_factory, other_db):
    """jobbers' default layout (records on the broker's db, results on another db of the
    same server): the completed step writes the result into that db, in the same script."""
    jobbers = proj.jobbers
    worker = worker_factory(concurrency=2, env={"PROJ_RESULT_BACKEND": other_db})
    results = [proj.add.delay(i, 10) for i in range(3)]
    app = reader(other_db)
    assert [app.AsyncResult(r.id).get(timeout=20) for r in results] == [10, 11, 12]
    other = redis.Redis.from_url(other_db, decode_responses=True)
    for r in results:
        wait_state(jobbers, r.id, S.COMPLETED, worker=worker)
        assert path(jobbers, r.id) == PUBLISH + START + COMPLETE
        assert stored_meta(jobbers.store.client, r.id) is None  # not on the jobbers db
        meta = stored_meta(other, r.id)
        assert meta is not None
        assert meta["status"] == "SUCCESS"
        assert meta["task_id"] == r.id
        assert 0 < other.ttl(f"celery-task-meta-{r.id}") <= 86400
    other.close()
    assert f"{FOLDED} (same Redis, db {OTHER_DB})" in worker.log
    assert UNFOLDED not in worker.log
    # the store's own connections stay on the store's db after the script's SELECT
    assert jobbers.store.client.get(f"celery-task-meta-{results[0].id}") is None


@pytest.mark.parametrize("where", ["other redis server", "filesystem"])
def test_result_backend_elsewhere_keeps_celerys_path(proj, worker_factory, tmp_path, where,
                                                     request):
    jobbers = proj.jobbers
    if where == "filesystem":
        folder = tmp_path / "results"
        folder.mkdir()
        backend_url = f"file://{folder}"
    else:
        backend_url = request.getfixturevalue("other_server")
    worker = worker_factory(concurrency=2, env={"PROJ_RESULT_BACKEND": backend_url})
    results = [proj.add.delay(i, 10) for i in range(3)]
    app = reader(backend_url)
    assert [app.AsyncResult(r.id).get(timeout=20) for r in results] == [10, 11, 12]
    for r in results:
        wait_state(jobbers, r.id, S.COMPLETED, worker=worker)
        assert path(jobbers, r.id) == PUBLISH + START + COMPLETE
        assert stored_meta(jobbers.store.client, r.id) is None  # not on the jobbers db
    assert UNFOLDED in worker.log
    assert FOLDED not in worker.log
    expected = ("not on the jobbers Redis server" if where != "filesystem"
                else "the result backend is FilesystemBackend")
    assert expected in worker.log
    # said loudly, once, at worker start, only where a Redis result write could be folded
    loud = "cannot carry Celery's result write"
    assert worker.log.count(loud) == (1 if where != "filesystem" else 0)


@pytest.mark.parametrize("where", ["folded", "other redis db"])
def test_stale_attempt_completion_is_refused_and_stores_no_result(proj, worker_factory, other_db,
                                                                  where):
    """Attempt 1 is declared stalled and resubmitted while it runs; attempt 2 starts. Attempt
    1 finishes first: its completion is refused and it must not store its result (the
    newer attempt owns the outcome); attempt 2's result is the one stored."""
    jobbers = proj.jobbers
    backend_url = other_db if where == "other redis db" else None
    env = {"PROJ_RESULT_BACKEND": backend_url} if backend_url else None
    worker = worker_factory(concurrency=2, env=env)
    results_client = redis.Redis.from_url(backend_url or proj.REDIS_URL, decode_responses=True)
    app = reader(backend_url) if backend_url else proj.app

    first = proj.by_attempt.delay([1.5, 4.0])
    wait_state(jobbers, first.id, S.STARTED, worker=worker)
    assert jobbers.store.step(first.id, S.STALLED, sources=(S.STARTED,),
                              reason="test: declared stalled").applied
    assert jobbers.resubmit([first.id]) == [first.id]
    wait_for(lambda: (jobbers.get(first.id).state == S.STARTED
                      and jobbers.get(first.id).attempt == 2), timeout=10,
             message="attempt 2 to start")

    wait_for(lambda: refused_completions(jobbers) >= 1, timeout=10,
             message="attempt 1's completion to be refused")
    # the refusal is counted in Redis a moment before the child writes its warning
    wait_for(lambda: "late completion of proj.by_attempt" in worker.log, timeout=5,
             message="the worker's warning about the late completion")
    record = jobbers.get(first.id)
    assert record.state == S.STARTED
    assert record.attempt == 2
    assert stored_meta(results_client, first.id) is None  # attempt 1 stored nothing
    assert app.AsyncResult(first.id).state == "PENDING"

    assert app.AsyncResult(first.id).get(timeout=20) == 2
    record = wait_state(jobbers, first.id, S.COMPLETED, worker=worker)
    assert record.attempt == 2
    assert [t.attempt for t in transitions(jobbers, first.id, S.COMPLETED)] == [2]
    meta = stored_meta(results_client, first.id)
    assert meta is not None
    assert meta["result"] == 2
    assert refused_completions(jobbers) == 1
    results_client.close()


def test_a_stored_success_is_never_overwritten(proj, worker_factory):
    """Like Celery's own store: a SUCCESS already stored for the id is kept."""
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(concurrency=1)
    task_id = "preexisting-success"
    earlier = json.dumps({"status": "SUCCESS", "result": "earlier", "traceback": None,
                          "children": [], "date_done": "2026-01-01T00:00:00",
                          "task_id": task_id})
    client.set(f"celery-task-meta-{task_id}", earlier)
    r = proj.add.apply_async((1, 1), task_id=task_id)
    wait_state(jobbers, r.id, S.COMPLETED, worker=worker)
    assert r.get(timeout=20) == "earlier"
    assert client.get(f"celery-task-meta-{task_id}") == earlier
    assert FOLDED in worker.log

