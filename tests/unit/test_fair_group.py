"""Fair shares hold a group's members back at publish, as they do a single publish: on the
in-memory store and a fake producer (no Redis, no broker; tests/unit/test_fast_bulk_publish.py's).
A ``concurrency_key`` task's members of a ``group`` (or a chord's header) whose key has no
room are parked by their batched step and send no message; the release publishes them with
their canvas options (group, index, chord); a store that cannot be reached lets every
message go, recorded at its start as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import Celery, chord, group

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.core.fairshare import FairKey, key_digest
from jobbers_celery.lifecycle.scheduler import release_and_publish
from jobbers_celery.testing import InMemoryDeadLetterSink, in_memory
from tests.unit.test_fast_bulk_publish import CountingStore, FakeProducer, default_producer

S = TaskState
NAME = "fairgroup.work"
CAP = 2


@pytest.fixture
def app() -> Celery:
    app = Celery("fair_group", broker="memory://")
    app.conf.jobbers_publish_batch = 4  # a few cuts: a key's room is seen across them
    return app


@pytest.fixture
def store(app: Celery) -> CountingStore:
    store = CountingStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    return store


def _task(app: Celery) -> Any:
    @app.task(base=JobbersTask, name=NAME, shared=False, max_concurrent=CAP,
              concurrency_key="tenant")
    def work(tenant: str, n: int) -> int:
        return n

    return work


def _key(tenant: str) -> FairKey:
    return FairKey(key_digest(tenant), CAP)


def _start(store: CountingStore, task_id: str, tenant: str) -> TaskState | None:
    return store.start(task_id, name=NAME, worker="w@h", wid="w@h:1:a", heartbeat_ms=None,
                       cap=CAP, lease_cap_ms=60_000, defer_ms=1000, fields={},
                       fair=_key(tenant)).state


def _complete(store: CountingStore, task_id: str) -> None:
    record = store.get(task_id)
    assert record is not None
    assert store.complete(task_id, record.attempt, name=NAME, worker="w@h", wid="w@h:1:a",
                          fields={}, delete=(), write_result=None).applied


def test_a_groups_members_past_their_keys_room_are_parked_and_send_nothing(
        app: Celery, store: CountingStore) -> None:
    work = _task(app)
    producer = FakeProducer(store)
    tenants = ["big"] * 8 + ["small"] * 3
    result = group(work.s(t, i) for i, t in enumerate(tenants)).apply_async(
        producer=producer)
    ids = [r.id for r in result.results]
    assert len(ids) == 11  # every member's AsyncResult
    assert store.batches == [4, 4, 3]  # still batched: no store call per member
    sent = [h["id"] for h in producer.sent]
    assert sent == [ids[0], ids[1], ids[8], ids[9]]  # each key's first CAP members
    assert all(producer.recorded_first)
    for i in (2, 3, 4, 5, 6, 7, 10):
        record = store.get(ids[i])
        assert record is not None
        assert record.state is S.SCHEDULED
        assert record.retry_attempt == 0
        assert record.group_id == result.id
        assert [t.reason for t in store.history(ids[i])][-1] == _key(tenants[i]).parked_reason
    held = {h.digest: h.parked for h in store.fair_held()}
    assert held == {key_digest("big"): 6, key_digest("small"): 1}


def test_a_parked_member_is_released_with_its_group_and_chord(
        app: Celery, store: CountingStore) -> None:
    """The release publishes a parked member from its record: its group id, its index and
    its chord go with it, so that the chord counts its part and the group's result
    completes."""
    work = _task(app)

    @app.task(base=JobbersTask, name="fairgroup.total", shared=False)
    def total(values: list[int]) -> int:
        return sum(values)

    app.conf.result_backend = "cache+memory://"
    producer = FakeProducer(store)
    with default_producer(app, producer):
        body = chord((work.s("big", i) for i in range(5)), total.s()).apply_async()
    assert body.parent is not None
    ids = [r.id for r in body.parent.results]  # the header's members, in order
    assert [h["id"] for h in producer.sent] == ids[:CAP]
    for task_id in ids[CAP:]:
        record = store.get(task_id)
        assert record is not None
        assert record.state is S.SCHEDULED
        options = json.loads(store.get_raw(task_id)["msg"])["options"]
        assert options["chord"]["task"] == "fairgroup.total"  # what its republish sends
    for task_id in ids[:CAP]:
        assert _start(store, task_id, "big") is S.STARTED
    _complete(store, ids[0])
    jobbers = in_memory(app)
    with default_producer(app, producer):
        assert release_and_publish(store, jobbers.publisher, [(NAME, key_digest("big"))],
                                   30_000, None) == 1
    released = producer.sent[-1]
    assert released["id"] == ids[CAP]  # the oldest parked first
    assert (released["group"], released["group_index"]) == (body.parent.id, CAP)
    assert store.get(ids[CAP]).state is S.SUBMITTED  # type: ignore[union-attr]


def test_the_store_away_lets_every_member_go_as_before(
        app: Celery, store: CountingStore, caplog: pytest.LogCaptureFixture) -> None:
    work = _task(app)
    store.fail_batches = True
    producer = FakeProducer(store)
    group(work.s("big", i) for i in range(9)).apply_async(producer=producer)
    assert len(producer.sent) == 9  # unrecorded: each parked, if need be, at its start
    assert not any(producer.recorded_first)
    assert "could not record the publish" in caplog.text


def test_a_member_without_its_key_goes_out_and_a_plain_publish_is_unchanged(
        app: Celery, store: CountingStore) -> None:
    """A member whose arguments give no key is sent (its start refuses it, as for a single
    publish); a group of a task without ``concurrency_key`` sends every member."""
    @app.task(base=JobbersTask, name="fairgroup.by_kwarg", shared=False, max_concurrent=CAP,
              concurrency_key=lambda a, k: k["tenant"])
    def by_kwarg(**kwargs: Any) -> None:
        return None

    @app.task(base=JobbersTask, name="fairgroup.plain", shared=False)
    def plain(n: int) -> int:
        return n

    producer = FakeProducer(store)
    group([by_kwarg.s(tenant="big"), by_kwarg.s(tenant="big"), by_kwarg.s(n=2),
           by_kwarg.s(tenant="big")]).apply_async(producer=producer)
    assert len(producer.sent) == 3  # 2 of big, and the keyless one
    other = FakeProducer(store)
    group(plain.s(i) for i in range(6)).apply_async(producer=other)
    assert len(other.sent) == 6
