"""A group's publish that the broker fails part-way under fair shares, on Redis (one shard:
decided in the steps; four: the global slot first), with the fake producer of
tests/unit/test_fast_bulk_publish.py: the members never sent give their keys' places back
at once and the members parked after the failed message are cancelled (the in-memory
version: tests/unit/test_fair_group_unsent.py)."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest
from celery import Celery, group

from jobbers_celery import JobbersTask, TaskState, install
from jobbers_celery.core.fairshare import key_digest
from tests.unit.test_fast_bulk_publish import FakeProducer, default_producer

pytestmark = [pytest.mark.redis]

S = TaskState
NAME = "fairunsent.redis"


@pytest.mark.parametrize("shards", [1, 4], ids=["one-shard", "four-shards"])
def test_members_never_sent_give_their_places_back_on_redis(redis_url: str,
                                                            shards: int) -> None:
    app = Celery("fair_unsent_redis", broker="memory://", set_as_current=False)
    app.conf.update(jobbers_redis_url=redis_url, jobbers_store_shards=shards,
                    jobbers_key_prefix=f"fu{uuid.uuid4().hex[:8]}")
    jobbers = install(app)
    store: Any = jobbers.store

    @app.task(base=JobbersTask, name=NAME, shared=False, max_concurrent=2,
              concurrency_key="tenant")
    def work(tenant: str, n: int) -> int:
        return n

    tenants = ["big", "big", "small", "big", "small", "small", "big"]
    ids = [f"{uuid.uuid4().hex[:8]}-m{i}" for i in range(len(tenants))]
    producer = FakeProducer(store, fail_at=ids[2])
    with pytest.raises(OSError, match="refused"):
        group(work.s(t, i).set(task_id=ids[i]) for i, t in enumerate(tenants)).apply_async(
            producer=cast(Any, producer))
    assert [h["id"] for h in producer.sent] == ids[:2]
    states = [store.get(i).state for i in ids]
    assert states == [S.SUBMITTED, S.SUBMITTED, S.DROPPED, S.CANCELLED, S.DROPPED,
                      S.CANCELLED, S.CANCELLED]
    keys = store.keys
    small = key_digest("small")
    assert store.client.zcard(keys.fair_released(NAME, small)) == 0
    assert store.client.zcard(keys.fair_parked(NAME, small)) == 0
    assert store.client.zcard(keys.fair_parked(NAME, key_digest("big"))) == 0
    assert store.client.zcard(keys.fair_released(NAME, key_digest("big"))) == 2  # m0, m1
    with default_producer(app, producer):
        work.apply_async(("small", 7), task_id=f"{ids[0]}-s7")
    assert store.get(f"{ids[0]}-s7").state is S.SUBMITTED  # small's room is free at once
