"""The sharded layout frees a unique lock with a call after the step that reached the
lock's point (``uniq.lua`` 'free', which deletes the key if it names that task id). A
copy of the same id that took the lock again between that step and that call (a DLQ or
manual resubmit, another resubmit of it at once) lost it to the late delete: its record
back in ``submitted``, its lock key gone, a publish of another copy of its key accepted,
so two copies would run. Now a resubmit that applied while its task held the lock
already counts it re-taken (its renewal, ``uniq.lua``), and the next delete by that task
is skipped: the resubmitted copy keeps the lock, and its own end deletes it. The interleavings are forced by running
the other call from inside the first one's ``uniq.lua`` call, on 4 and 16 shards (one
Redis is not concerned: there the step deletes the lock itself).

The price, also tested: a resubmit that found the lock naming its task when no delete was
in flight (a window's lock, which its end keeps) skips the delete at the copy's next
point; the key left names a copy past its point, which counts as free (the next publish
takes it over), as a key whose delete was lost does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest

from jobbers_celery.core.states import RESUBMITTABLE, TaskState
from jobbers_celery.core.unique import Until
from jobbers_celery.store import RedisStore
from tests.integration.store_helpers import NAME
from tests.integration.unique_cases import WID, digest, lock, publish, start, state_of, uq

pytestmark = [pytest.mark.redis]

S = TaskState
SHARDED = [4, 16]


@contextmanager
def before_uniq(store: RedisStore, op: str, then: Callable[[], None]) -> Iterator[list[int]]:
    """``then()`` runs once, right before the first ``uniq.lua`` call ``op`` ('take':
    right after it, so that what ``then()`` does finds the lock taken). Yields how often
    it ran."""
    real = store._scripts["uniq"]
    ran = [0]

    def call(keys: list[str], args: list[Any]) -> Any:
        if args[0] != op or ran[0]:
            return real(keys=keys, args=args)
        ran[0] += 1
        if op == "take":
            out = real(keys=keys, args=args)
            then()
            return out
        then()
        return real(keys=keys, args=args)

    store._scripts["uniq"] = cast(Any, call)
    try:
        yield ran
    finally:
        store._scripts["uniq"] = real


def resubmit(store: RedisStore, task_id: str) -> Any:
    return store.submit(task_id, sources=RESUBMITTABLE, lease_ms=30_000, reason="resubmitted")


def failed(store: RedisStore, task_id: str, field: str) -> None:
    assert publish(store, task_id, field).applied
    start(store, task_id)
    assert store.step(task_id, S.FAILED, fence=1, wid=WID, name=NAME, reason="boom").applied


@pytest.mark.parametrize("shards", SHARDED)
def test_a_resubmit_between_an_end_and_its_lock_delete_keeps_the_lock(
    make_store: Any, shards: int
) -> None:
    """A copy fails; before its worker's delete of the lock reaches the global slot, an
    operator resubmits it (the take finds the lock naming it, the step applies, the lock
    is renewed); then the delete arrives."""
    store = make_store(prefix=f"stalefree{shards}", shards=shards)
    field = uq()
    assert publish(store, "a", field).applied
    start(store, "a")
    with before_uniq(store, "free", lambda: resubmit(store, "a")) as ran:
        assert store.step("a", S.FAILED, fence=1, wid=WID, name=NAME, reason="boom").applied
    assert ran == [1]
    assert state_of(store, "a") is S.SUBMITTED  # resubmitted: it will run again
    assert store.unique_holder(digest(field)) == "a"
    assert publish(store, "b", field).why == "duplicate:a"
    ends_and_deletes_its_lock(store, "a", field)


@pytest.mark.parametrize("shards", SHARDED)
def test_two_resubmits_at_once_keep_the_lock(make_store: Any, shards: int) -> None:
    """Two resubmits of a failed copy at once: the first takes the lock (free since the
    copy's end), the second finds it naming the copy and its step applies; the first's
    step is refused (the copy is submitted now) and it gives back the lock it took."""
    store = make_store(prefix=f"stalefree2{shards}", shards=shards)
    field = uq()
    failed(store, "a", field)
    second: list[Any] = []
    with before_uniq(store, "take", lambda: second.append(resubmit(store, "a"))):
        first = resubmit(store, "a")
    assert second[0].applied
    assert not first.applied
    assert state_of(store, "a") is S.SUBMITTED
    assert store.unique_holder(digest(field)) == "a"
    assert publish(store, "b", field).why == "duplicate:a"
    ends_and_deletes_its_lock(store, "a", field)


def ends_and_deletes_its_lock(store: RedisStore, task_id: str, field: str) -> None:
    """The resubmitted copy runs (its second attempt) and completes: that end deletes the
    lock key (the late delete was the one skipped), and another copy is accepted."""
    start(store, task_id)
    assert store.step(task_id, S.COMPLETED, fence=2, wid=WID, name=NAME).applied
    assert store.client.exists(lock(store, field)) == 0
    assert publish(store, "c", field).applied


@pytest.mark.parametrize("shards", SHARDED)
def test_a_skipped_delete_leaves_a_key_that_counts_as_free(make_store: Any, shards: int) -> None:
    """A window's copy fails (its window goes on), is resubmitted (the lock naming it
    already: counted re-taken, though no delete was in flight), then cancelled: that
    cancel's delete is the one skipped. The key left names a cancelled copy: free for
    every reader, and the next publish takes it over."""
    store = make_store(prefix=f"stalefree3{shards}", shards=shards)
    field = uq(Until.WINDOW)
    failed(store, "a", field)
    assert store.unique_holder(digest(field)) == "a"  # the window outlives the copy
    assert resubmit(store, "a").applied
    assert store.cancel("a", "not wanted").outcome == "cancelled"
    assert store.client.get(lock(store, field)) == "a"  # not deleted
    assert store.unique_holder(digest(field)) is None
    assert publish(store, "b", field).applied
    assert store.unique_holder(digest(field)) == "b"


@pytest.mark.parametrize("shards", SHARDED)
def test_a_republish_of_the_same_id_does_not_count(make_store: Any, shards: int) -> None:
    """A copy re-queued (``started -> unsubmitted``, a retry at once or a shutdown's
    resubmit) and published again under its id: its take finds the lock naming it, and
    its step applies, but no delete can be in flight (it has not reached the lock's point):
    nothing is counted, so the copy's end deletes the key."""
    store = make_store(prefix=f"stalefree4{shards}", shards=shards)
    field = uq()
    assert publish(store, "a", field).applied
    start(store, "a")
    assert store.step("a", S.UNSUBMITTED, fence=1, wid=WID, name=NAME, reason="again").applied
    assert publish(store, "a", field).applied
    assert publish(store, "b", field).why == "duplicate:a"
    ends_and_deletes_its_lock(store, "a", field)
