"""Unique tasks' locks in the store (``_lib.lua``'s ``uq_*``, ``uniq.lua``), and the
in-memory store's, driven by the same cases: one publish takes the lock, a second copy is
refused naming the holder, the lock is freed at its point (start, end, a cancel, a window's
expiry), a holder past its point or removed frees it, a resubmit takes it again."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import Unique, Until, field_value, key_digest
from jobbers_celery.testing import InMemoryStore
from tests.integration.store_helpers import NAME, QUEUE

pytestmark = [pytest.mark.redis]

S = TaskState


def uq(until: Until = Until.END, ttl: float | None = None, key: str = "k") -> str:
    spec = Unique(until=until, ttl=ttl)
    return field_value(spec, key_digest(NAME, spec, [key], {}))


def publish(store: Any, task_id: str, field: str) -> Any:
    return store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name=NAME,
                        create={"name": NAME, "queue": QUEUE, "uq": field},
                        fields={"msg": "{}"})


@pytest.fixture(params=["redis-1", "redis-16", "memory"])
def store(request: pytest.FixtureRequest, make_store: Any) -> Any:
    if request.param == "memory":
        return InMemoryStore()
    return make_store(shards=int(request.param.split("-")[1]))


def test_one_copy_takes_the_lock_and_a_second_names_it(store: Any) -> None:
    field = uq()
    assert publish(store, "a", field).applied
    second = publish(store, "b", field)
    assert not second.applied
    assert second.why == "duplicate:a"
    assert store.get_raw("b") in (None, {})
    assert store.unique_holder(field.split(":")[2]) == "a"
    assert publish(store, "c", uq(key="other")).applied  # another key: its own lock


def test_a_second_publish_of_the_same_id_keeps_its_lock(store: Any) -> None:
    """``apply_async(task_id=...)`` twice: the second step is refused (the record exists),
    and must not give back the lock the first publish holds (the sharded layout did, and a
    copy with another id then ran beside it; found by review)."""
    field = uq()
    assert publish(store, "a", field).applied
    assert not publish(store, "a", field).applied
    assert store.unique_holder(field.split(":")[2]) == "a"
    assert publish(store, "b", field).why == "duplicate:a"


def test_until_end_keeps_the_lock_through_a_retry_and_frees_it_at_the_end(store: Any) -> None:
    field = uq()
    digest = field.split(":")[2]
    assert publish(store, "a", field).applied
    assert store.step("a", S.STARTED, start=True, worker="w@h", wid="w1", name=NAME).applied
    assert store.step("a", S.SCHEDULED, fence=1, wid="w1", name=NAME, delay_ms=600_000,
                      reason="retry").applied
    assert publish(store, "b", field).why == "duplicate:a"
    assert store.step("a", S.SUBMITTED, sources=(S.SCHEDULED,), reason="due").applied
    assert store.step("a", S.STARTED, start=True, worker="w@h", wid="w1", name=NAME).applied
    assert store.step("a", S.FAILED, fence=2, wid="w1", name=NAME, reason="boom").applied
    assert store.unique_holder(digest) is None
    assert publish(store, "b", field).applied
    # a resubmit of the failed copy takes the lock again: refused while b holds it
    again = store.step("a", S.SUBMITTED, sources=(S.FAILED,), reason="resubmit")
    assert not again.applied
    assert again.why == "duplicate:b"
    assert store.step("b", S.CANCELLED, sources=(S.SUBMITTED,), reason="cancel").applied
    assert store.step("a", S.SUBMITTED, sources=(S.FAILED,), reason="resubmit").applied
    assert store.unique_holder(digest) == "a"


def test_until_start_frees_the_lock_when_the_copy_starts(store: Any) -> None:
    field = uq(Until.START)
    assert publish(store, "a", field).applied
    assert publish(store, "b", field).why == "duplicate:a"
    assert store.step("a", S.STARTED, start=True, worker="w@h", wid="w1", name=NAME).applied
    assert publish(store, "b", field).applied


def test_a_window_outlives_its_task_until_its_ttl_but_not_a_cancel(store: Any) -> None:
    field = uq(Until.WINDOW, ttl=0.5)
    assert publish(store, "a", field).applied
    assert store.step("a", S.STARTED, start=True, worker="w@h", wid="w1", name=NAME).applied
    assert store.step("a", S.COMPLETED, fence=1, wid="w1", name=NAME).applied
    assert publish(store, "b", field).why == "duplicate:a"
    deadline = time.monotonic() + 5
    while not publish(store, "b", field).applied:
        assert time.monotonic() < deadline, "the window never expired"
        time.sleep(0.05)
    assert store.step("b", S.CANCELLED, sources=(S.SUBMITTED,), reason="cancel").applied
    assert publish(store, "c", field).applied


def test_a_holder_removed_or_stalled_frees_its_lock(store: Any) -> None:
    field = uq()
    assert publish(store, "a", field).applied
    assert store.step("a", S.STARTED, start=True, worker="w@h", wid="w1", name=NAME).applied
    assert store.step("a", S.STALLED, fence=1, wid="w1", name=NAME, reason="stall").applied
    assert publish(store, "b", field).applied
    # b's record removed (purge, retention) while its lock stays: the lock is free
    if isinstance(store, InMemoryStore):
        del store._records["b"]
    else:
        store.client.delete(store.keys_of("b").task("b"))
        if store.sharded:  # a holder without a record counts 10 s from its take (uniq.lua)
            lock = store.keys.unique(field.split(":")[2])
            store.client.pexpire(lock, store.client.pttl(lock) - 20_000)
    assert publish(store, "c", field).applied
    assert store.unique_holder(field.split(":")[2]) == "c"


def test_a_batched_publish_refuses_the_members_whose_lock_is_held(store: Any) -> None:
    """submit_many (a group's bulk publish): each member takes its lock as a single
    publish does; on the sharded layout a refused take sends no step for it."""
    from jobbers_celery.store import Submission

    field = uq()
    assert publish(store, "a", field).applied
    items = [Submission(i, NAME, {"name": NAME, "queue": QUEUE, "uq": f}, {"msg": "{}"})
             for i, f in (("b", field), ("c", uq(key="c")), ("d", uq(key="c")))]
    results = store.submit_many(items).results()
    assert [getattr(r, "why", None) for r in results] == ["duplicate:a", None, "duplicate:c"]
    assert [getattr(r, "applied", None) for r in results] == [False, True, False]


def test_the_lock_survives_a_store_restart_with_aof() -> None:
    """Redis killed (SIGKILL) and restarted with appendfsync always: the lock and its
    holder's record come back, a second copy is still refused (docs/howto/unique.md says
    what everysec and no persistence can lose)."""
    import redis

    from jobbers_celery.store import RedisStore
    from tests.conftest import wait_for
    from tests.integration.topology_servers import restartable_redis

    with restartable_redis("always") as server:
        store = RedisStore.from_url(server.url(), prefix="aof", shards=1)
        field = uq()
        assert publish(store, "a", field).applied
        server.kill()
        server.restart()
        probe = redis.Redis.from_url(server.url())

        def up() -> bool:
            try:
                return bool(probe.ping())
            except redis.RedisError:
                return False

        wait_for(up, timeout=20, message="redis to come back")
        again = wait_for(lambda: _publish_or_none(store, "b", field), timeout=20,
                         message="a publish after the restart")
        assert again.why == "duplicate:a"
        probe.close()
        store.client.close()


def _publish_or_none(store: Any, task_id: str, field: str) -> Any:
    import redis

    try:
        return publish(store, task_id, field)
    except (redis.RedisError, OSError):
        return None


def test_a_purge_frees_the_locks_of_what_it_cancels_and_removes(store: Any) -> None:
    waiting, done = uq(key="waiting"), uq(key="done")
    assert publish(store, "a", waiting).applied
    assert publish(store, "b", done).applied
    assert store.step("b", S.STARTED, start=True, worker="w@h", wid="w1", name=NAME).applied
    assert store.step("b", S.FAILED, fence=1, wid="w1", name=NAME, reason="boom").applied
    store.purge(NAME, None, None)  # a cancelled, b removed
    assert publish(store, "c", waiting).applied
    assert publish(store, "d", done).applied


def test_the_step_at_the_lock_point_deletes_the_lock_key(make_store: Any) -> None:
    """One shard: the step deletes it; sharded: the step returns it and its caller deletes
    it in the global slot (as a max_concurrent lease); a capped task frees both."""
    for shards in (1, 16):
        store = make_store(prefix=f"del{shards}", shards=shards)
        field = uq()
        lock = store.keys.unique(field.split(":")[2])
        assert publish(store, "a", field).applied
        assert store.client.get(lock) == "a"
        assert store.step("a", S.STARTED, start=True, worker="w@h", wid="w1", name=NAME,
                          cap=3).applied
        assert store.step("a", S.COMPLETED, fence=1, wid="w1", name=NAME).applied
        assert store.client.exists(lock) == 0
        assert store.client.zcard(store.keys.concurrency(NAME)) == 0
