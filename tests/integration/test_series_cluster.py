"""The history's writes on a real Redis Cluster (three masters and their replicas): the
steps' script builds the hour keys from the task key's hash tag, without declaring them,
so each must land in the task's slot, which Redis Cluster checks; a read pipelines every
shard's hours over the masters. No Celery worker (test_on_cluster.py runs the workers)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from redis.cluster import RedisCluster

from jobbers_celery.core.series import MinuteCounts
from jobbers_celery.core.states import TaskState
from jobbers_celery.store import RedisStore
from jobbers_celery.telemetry.series import Series
from tests.integration.topology_servers import ClusterSet, cluster_set

pytestmark = [pytest.mark.redis, pytest.mark.cluster]

S = TaskState


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterSet]:
    with cluster_set() as servers:
        yield servers


def test_steps_write_the_history_in_their_slot_on_a_cluster(cluster: ClusterSet) -> None:
    client = RedisCluster.from_url(cluster.url(0), decode_responses=True)
    try:
        store = RedisStore(client, "hc", shards=16)
        store.series_configure(7, 200)
        for i in range(40):  # over the 16 shards, on the three masters
            task_id = f"task-{i}"
            assert store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                              create={"name": "shop.import", "queue": f"q{i % 2}"},
                              reason="published", name="shop.import").applied
            assert store.step(task_id, S.STARTED, start=True, worker="w1").applied
            assert store.step(task_id, S.FAILED if i % 4 == 0 else S.COMPLETED).applied
        series = Series(store, 7, 200)
        since = datetime.fromtimestamp(store.now_ms() / 1000, tz=UTC) - timedelta(minutes=10)
        named = sum((p.counts for p in series.read(name="shop.import", since=since).points),
                    MinuteCounts())
        assert (named.completed, named.failed, named.started, named.ended) == (30, 10, 40, 40)
        every = sum((p.counts for p in series.read(since=since).points), MinuteCounts())
        assert (every.completed, every.failed) == (30, 10)
        assert series.names() == (["shop.import"], ["q0", "q1"])
        shards = {store.shards.index(f"task-{i}") for i in range(40)}
        assert len(shards) > 8  # the writes really spread over many slots
    finally:
        client.close()
