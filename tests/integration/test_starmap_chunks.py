"""``starmap``, ``map`` and ``chunks`` with jobbers: each chunk (Celery's ``celery.starmap``
or ``celery.map`` task) is a tracked task (``jobbers_celery.worker.canvas``), and the caller
sees exactly what plain Celery gives: the same results, the same errors.

Differential: the same canvases on ``tests.integration.chord_proj`` (jobbers) and
``tests.integration.chord_plain_proj`` (plain ``celery.Task``, no jobbers), real workers.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobbers_celery import get_jobbers
from jobbers_celery.core.states import TaskState
from jobbers_celery.worker.canvas import TrackedMap
from tests.conftest import Worker, start_worker, wait_for
from tests.integration.lifecycle_helpers import dead_letters, wait_state

ITEMS = [(i, i * 2) for i in range(7)]


@pytest.fixture
def apps(redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Both apps, each with a worker of its own (their queues differ)."""
    import importlib

    found = {"plain": importlib.import_module("tests.integration.chord_plain_proj").app,
             "jobbers": importlib.import_module("tests.integration.chord_proj").app}
    workers: list[Worker] = []
    try:
        for kind, module in (("plain", "chord_plain_proj"), ("jobbers", "chord_proj")):
            workers.append(start_worker(found[kind], f"tests.integration.{module}", tmp_path,
                                        concurrency=2))
        yield found
    finally:
        for worker in workers:
            worker.kill()


def _add(app: Any) -> Any:
    return app.tasks[f"{app.main}.add"]


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the caller sees its type and text
        return "raised", (type(exc).__name__, str(exc))


@pytest.mark.parametrize("case", ["starmap", "map", "chunks", "starmap-fails", "chunks-fails"])
def test_the_caller_sees_what_plain_celery_gives(apps: dict[str, Any], case: str) -> None:
    seen: dict[str, tuple[str, Any]] = {}
    for kind, app in apps.items():
        add = _add(app)
        items = [*ITEMS, (-1, 0)] if case.endswith("fails") else ITEMS
        if case.startswith("starmap"):
            result = add.starmap(items).apply_async()
        elif case == "map":
            result = app.tasks[f"{app.main}.collect"].map([[1], [2, 3]]).apply_async()
        else:
            result = add.chunks(items, 3).apply_async()
        seen[kind] = _outcome(lambda result=result: result.get(timeout=30))
    assert seen["jobbers"] == seen["plain"]
    if not case.endswith("fails"):
        assert seen["jobbers"][0] == "ok"
    else:
        assert seen["jobbers"] == ("raised", ("ValueError", "negative: -1"))


def test_a_chunk_is_a_tracked_task_with_progress(apps: dict[str, Any]) -> None:
    app = apps["jobbers"]
    jobbers = get_jobbers(app)
    assert isinstance(app.tasks["celery.starmap"], TrackedMap)
    assert isinstance(app.tasks["celery.map"], TrackedMap)
    assert not isinstance(apps["plain"].tasks["celery.starmap"], TrackedMap)
    result = _add(app).chunks(ITEMS, 3).apply_async()
    assert result.get(timeout=30) == [[0, 3, 6], [9, 12, 15], [18]]
    for chunk in result.results:
        record = wait_state(jobbers, chunk.id, TaskState.COMPLETED)
        assert record.name == "celery.starmap"
        assert record.queue == "chordj"  # routed as its items' task (Celery's route_name)
    sizes = sorted(jobbers.get(c.id).progress["of"] for c in result.results)
    assert sizes == [1, 3, 3]
    assert all(jobbers.get(c.id).progress["done"] == jobbers.get(c.id).progress["of"]
               for c in result.results)
    # the chunks are one canvas: a group of three tracked members, completed
    workflow = jobbers.workflow(result.results[0].id)
    assert workflow is not None
    assert sorted(m.record.task_id for m in workflow.members) == sorted(
        c.id for c in result.results)
    assert (workflow.total, workflow.completed, workflow.state.value) == (3, 3, "completed")
    assert {m.group_id for m in workflow.members} == {result.id}


def test_a_failed_chunk_is_dead_lettered_and_resubmitted_whole(
        apps: dict[str, Any], redis_url: str) -> None:
    app = apps["jobbers"]
    jobbers = get_jobbers(app)
    key = f"flag-{uuid.uuid4().hex}"
    member = app.tasks[f"{app.main}.member"]
    result = member.starmap([(0,), (1, key), (2,)]).apply_async()
    with pytest.raises(ValueError, match="is not fixed"):
        result.get(timeout=30)
    record = wait_state(jobbers, result.id, TaskState.FAILED)
    assert record.progress == {"done": 1, "of": 3}  # the item before the failure
    wait_for(lambda: dead_letters(jobbers, result.id))  # written just after the step
    assert [e.task_id for e in dead_letters(jobbers, result.id)] == [result.id]

    client = redis.Redis.from_url(redis_url)
    client.set(key, "fixed")
    client.close()
    assert jobbers.resubmit([result.id]) == [result.id]
    wait_state(jobbers, result.id, TaskState.COMPLETED)
    wait_for(lambda: app.AsyncResult(result.id).state == "SUCCESS", timeout=20)
    assert app.AsyncResult(result.id).result == [0, 10, 20]
