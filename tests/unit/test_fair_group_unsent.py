"""A group's publish that the broker fails part-way, under fair shares (in-memory store, a
fake producer: tests/unit/test_fast_bulk_publish.py's): the members never sent give their
keys' places back at once, and the members parked after the failed message are cancelled,
not released later (Celery's loop stops at the raise: they would never have gone)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from celery import Celery, group

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.testing import InMemoryDeadLetterSink, in_memory
from tests.unit.test_fast_bulk_publish import CountingStore, FakeProducer, default_producer

S = TaskState
CAP = 2


@pytest.fixture
def app() -> Celery:
    return Celery("fair_group_unsent", broker="memory://")


@pytest.fixture
def store(app: Celery) -> CountingStore:
    store = CountingStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    return store


def _task(app: Celery) -> Any:
    @app.task(base=JobbersTask, name="fairunsent.work", shared=False, max_concurrent=CAP,
              concurrency_key="tenant")
    def work(tenant: str, n: int) -> int:
        return n

    return work


def _state(store: CountingStore, task_id: str) -> TaskState:
    record = store.get(task_id)
    assert record is not None, task_id
    return record.state


def test_members_never_sent_give_their_places_back_and_those_parked_after_are_cancelled(
        app: Celery, store: CountingStore) -> None:
    work = _task(app)
    tenants = ["big", "big", "small", "big", "small", "small", "big"]
    sigs = [work.s(t, i).set(task_id=f"m{i}") for i, t in enumerate(tenants)]
    producer = FakeProducer(store, fail_at="m2")
    with pytest.raises(OSError, match="refused"):
        group(sigs).apply_async(producer=cast(Any, producer))
    assert [h["id"] for h in producer.sent] == ["m0", "m1"]
    assert [_state(store, f"m{i}") for i in range(7)] == [
        S.SUBMITTED, S.SUBMITTED,  # sent before the failure: they run, as in Celery
        S.DROPPED,  # the failed message
        S.CANCELLED,  # parked after it: never released
        S.DROPPED,  # admitted after it, never sent
        S.CANCELLED, S.CANCELLED]
    assert "never sent" in ([t.reason for t in store.history("m3")][-1] or "")
    # nothing is left parked, and the small tenant's places are free again at once (they
    # were counted on their way for 5 minutes before): its next task goes out
    assert store.fair_held() == []
    with default_producer(app, producer):
        work.apply_async(("small", 7), task_id="s7")
        assert _state(store, "s7") is S.SUBMITTED
        assert producer.sent[-1]["id"] == "s7"
        # the big tenant's two sent members still hold its places: its next one is parked
        work.apply_async(("big", 8), task_id="b8")
    assert _state(store, "b8") is S.SCHEDULED
    assert producer.sent[-1]["id"] == "s7"
    assert store.fair_release().ids == {}
