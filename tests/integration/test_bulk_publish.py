"""A group's members recorded a batch at a time (``jobbers.lifecycle.bulk``), on a real
Redis with a real prefork worker that consumes while the group is still being published.

- every member is recorded ``submitted`` by the publish, before its message can run: its
  history begins with the publish's step, never with the worker's late record of a message
  that had none ("recorded by the worker: no submission record"), and the publish took
  ``ceil(N / jobbers_publish_batch)`` store calls for its members, not N;
- the store killed during the publish (a batch's write fails): no message is lost, each
  member runs once, the members of the batches written before the outage keep their
  publish's record and the others are recorded by the worker at their start, as a single
  publish that could not be recorded is.
"""

from __future__ import annotations

import gc
import math
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from celery import group

from jobbers_celery import TaskState, get_jobbers
from jobbers_celery.core.states import TERMINAL
from jobbers_celery.store import RedisStore
from tests.conftest import start_worker, wait_for
from tests.integration import fault_proj
from tests.integration.topology_servers import restartable_redis

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
LATE = "recorded by the worker: no submission record"


def _counting(store: RedisStore) -> list[int]:
    """Count the store's batched submits (their sizes) and its single ones."""
    sizes: list[int] = []
    submit_many = store.submit_many

    def counted(items: Sequence[Any]) -> Any:
        sizes.append(len(items))
        return submit_many(items)

    store.submit_many = counted  # type: ignore[method-assign]
    return sizes


def _histories(store: RedisStore, ids: list[str]) -> dict[str, list[str]]:
    return {i: [t.reason or "" for t in store.history(i)] for i in ids}


def test_a_group_is_recorded_in_batches_before_its_members_run(redis_url: str,
                                                               tmp_path: Path) -> None:
    name = f"bulk{uuid.uuid4().hex[:6]}"
    app = fault_proj.build(redis_url, name=name)  # jobbers_publish_batch: 200, the default
    jobbers = get_jobbers(app)
    short = app.tasks[f"{name}.short"]
    worker = start_worker(app, "tests.integration.fault_proj", tmp_path, concurrency=2,
                          env={"FAULT_PROJ_BROKER": redis_url, "FAULT_PROJ_NAME": name})
    try:
        sizes = _counting(jobbers.store)  # type: ignore[arg-type]
        members = 600
        result = group(short.s(0) for _ in range(members)).apply_async()
        ids, group_id = [r.id for r in result.results], result.id
        del result  # its handles unsubscribe when collected: while the backend's Redis is up
        gc.collect()
        assert sizes == [200] * 3  # 3 store calls for 600 members
        assert math.ceil(members / 200) == len(sizes)

        def done() -> bool:
            return all((r := jobbers.get(i)) is not None and r.state in TERMINAL for i in ids)

        wait_for(done, timeout=120, interval=0.2, message="every member to finish")
    finally:
        worker.stop()
    histories = _histories(jobbers.store, ids)  # type: ignore[arg-type]
    late = [i for i, h in histories.items() if LATE in h]
    assert late == []  # the worker always found the publish's record
    assert {jobbers.get(i).state for i in ids} == {S.COMPLETED}  # type: ignore[union-attr]
    assert all(h[0] == "published" for h in histories.values())
    assert {jobbers.get(i).group_id for i in ids} == {group_id}  # type: ignore[union-attr]
    # the workflow fields a single publish records came with the batch: one unit, complete
    workflow = jobbers.workflow(group_id, limit=10)
    assert workflow is not None
    assert (workflow.total, workflow.completed, workflow.failed) == (members, members, 0)
    assert workflow.truncated
    assert LATE not in worker.log


def test_the_store_killed_during_a_groups_publish_loses_no_member(redis_url: str,
                                                                 tmp_path: Path) -> None:
    name = f"bulkout{uuid.uuid4().hex[:6]}"
    marks = tmp_path / "marks"
    marks.mkdir()
    with restartable_redis("always") as store_server:
        # results in memory: the result handles of this process never reach for a Redis
        app = fault_proj.build(redis_url, store=store_server.url(), name=name,
                               backend="cache+memory://")
        jobbers = get_jobbers(app)
        store: RedisStore = jobbers.store  # type: ignore[assignment]
        short = app.tasks[f"{name}.short"]
        send_many = store._transition.send_many
        calls = [0]

        def killing(batch: Sequence[tuple[list[str], list[str]]]) -> Callable[[], list[Any]]:
            calls[0] += 1
            if calls[0] == 2:  # the second batch meets the outage, and every one after it
                store_server.kill()
            return send_many(batch)

        store._transition.send_many = killing  # type: ignore[method-assign]
        members = 600
        result = group(short.s(0) for _ in range(members)).apply_async(ignore_result=True)
        ids = [r.id for r in result.results]
        del result
        gc.collect()
        assert calls[0] == 3
        store_server.restart()
        worker = start_worker(app, "tests.integration.fault_proj", tmp_path, concurrency=2,
                              env={"FAULT_PROJ_BROKER": redis_url, "FAULT_PROJ_NAME": name,
                                   "FAULT_PROJ_STORE": store_server.url(),
                                   "FAULT_PROJ_BACKEND": "cache+memory://",
                                   "FAULT_PROJ_MARKS": str(marks)})
        try:
            reader = RedisStore.from_url(store_server.url())

            def done() -> bool:
                return all((r := reader.get(i)) is not None and r.state in TERMINAL
                           for i in ids)

            wait_for(done, timeout=120, interval=0.2, message="every member to finish")
            histories = _histories(reader, ids)
            states = {reader.get(i).state for i in ids}  # type: ignore[union-attr]
            reader.client.connection_pool.disconnect()
        finally:
            worker.stop()
            store.client.connection_pool.disconnect()
    assert states == {S.COMPLETED}
    ran = [p.name.split(".")[0] for p in marks.iterdir()]
    assert sorted(ran) == sorted(ids)  # each member ran once: none lost, none twice
    first = [h[0] for h in (histories[i] for i in ids)]
    # the batch written before the outage: the publish's records
    assert first[:200] == ["published"] * 200
    # the batches the outage met went out unrecorded; their worker recorded each at start
    assert all(reason.startswith(LATE) for reason in first[200:]), set(first[200:])
