"""The dataset's number of shards: written at first use, the same for every process, a
disagreeing setting refused (a worker does not start), a dataset from before shards read as
one; and the sharded layout against the one-tag layout on the same steps (real Redis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobbers_celery import TaskState
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.store import RedisStore
from tests.conftest import start_worker
from tests.integration.lifecycle_helpers import wait_state
from tests.integration.store_helpers import create, put_in_state

pytestmark = [pytest.mark.redis]

S = TaskState


def test_the_number_is_written_at_first_use_and_read_by_every_process(make_store) -> None:
    first = make_store(prefix="lay", shards=8)
    assert first.shards.count == 8
    assert first.client.get(first.keys.layout) == "8"
    assert make_store(prefix="lay", shards=None).shards.count == 8  # unset: the dataset's
    with pytest.raises(ConfigurationError, match=r"is 4, but .* has 8 shards"):
        make_store(prefix="lay", shards=4).shards  # noqa: B018


def test_a_new_dataset_on_one_server_gets_one_shard_unless_set(make_store) -> None:
    store = make_store(prefix="fresh", shards=None)
    assert store.shards.count == 1
    create(store, "t1")
    assert store.client.exists("{fresh}:task:t1")  # the one-tag layout, key for key


def test_a_dataset_from_before_shards_is_one_shard_and_refuses_another_number(
        make_store) -> None:
    old = make_store(prefix="old", shards=1)
    create(old, "t1")
    old.client.delete(old.keys.layout)  # as a jobbers without shards left it
    with pytest.raises(ConfigurationError, match="written with one shard"):
        make_store(prefix="old", shards=16).shards  # noqa: B018
    again = make_store(prefix="old", shards=None)
    assert again.shards.count == 1
    assert again.get("t1") is not None
    assert again.client.get(again.keys.layout) == "1"


@pytest.mark.parametrize("shards", [1, 16])
def test_both_layouts_agree_on_every_read(make_store, shards: int) -> None:
    """The same records, written through the same steps, read the same way whatever the
    number of shards (the merged listings included)."""
    store = make_store(prefix=f"agree{shards}", shards=shards)
    states = [S.SUBMITTED, S.STARTED, S.COMPLETED, S.FAILED, S.SCHEDULED, S.CANCELLED]
    ids = [f"task-{i:03d}" for i in range(60)]
    for n, task_id in enumerate(ids):
        put_in_state(store, task_id, states[n % len(states)], name=f"n{n % 3}")
    assert sum(store.counts().values()) == 60
    assert store.counts()[S.COMPLETED] == 10
    newest = [r.task_id for r in store.tasks(limit=25)]
    assert newest == [r.task_id for r in store.tasks(limit=60)][:25]
    subs = [r.submitted_at for r in store.tasks(limit=60)]
    assert subs == sorted(subs, reverse=True)
    assert {r.task_id for r in store.tasks(name="n1", limit=100)} == set(ids[1::3])
    assert len(store.tasks(state=S.FAILED, name="n1", limit=100)) == len(
        [i for n, i in enumerate(ids) if n % 3 == 1 and n % len(states) == 3])
    runs = [r.run_at for r in store.scheduled(limit=100)]
    assert len(runs) == 10
    assert runs == sorted(runs)
    if shards > 1:  # the records are spread
        assert len({store.shards.index(i) for i in ids}) > 8


def test_a_worker_configured_with_another_number_does_not_start(
        proj: Any, make_store, tmp_path: Path) -> None:
    make_store(prefix="jobbers", shards=16).shards  # noqa: B018 - the dataset: 16 shards
    with pytest.raises(AssertionError, match="exited early") as failed:
        start_worker(proj.app, "tests.integration.proj", tmp_path,
                     env={"PROJ_SHARDS": "4"}, timeout=30)
    assert "jobbers_store_shards is 4" in str(failed.value)
    assert "has 16 shards" in str(failed.value)


def test_a_sharded_worker_runs_tasks_with_their_keys_in_their_shards(
        proj: Any, worker_factory: Any) -> None:
    worker = worker_factory(concurrency=2)
    ids = [proj.add.delay(i, i).id for i in range(16)]
    store: RedisStore = proj.jobbers.store
    for task_id in ids:
        wait_state(proj.jobbers, task_id, S.COMPLETED, worker=worker)
        assert store.client.exists(store.keys_of(task_id).task(task_id))
    assert len({store.shards.index(i) for i in ids}) > 4
    assert not store.client.exists(*(store.keys.task(i) for i in ids))  # not the global tag
