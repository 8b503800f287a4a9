"""The sharded layout frees a unique lock with a call after the step that reached the
lock's point (``uniq.lua`` 'free', which deletes the key if it names that task id). A
copy of the same id that takes the lock again between that step and that call (a DLQ or
manual resubmit, another resubmit of it at once) loses it to the late delete: its record
is back in ``submitted``, its lock key is gone, and a publish of another copy of its key is
accepted, so two copies would run. The interleavings are forced here by running the other
call from inside the first one's ``uniq.lua`` call.

Pending (xfail, strict): fencing the delete needs the step that reaches the lock's point to
carry what the lock was taken with (a generation the take returns, kept in the record,
returned by the step and matched by 'free'), in ``prechecks.py``, ``steps.py`` and
``_lib.lua``. One Redis is not concerned: there the step deletes the lock itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest

from jobbers_celery.core.states import RESUBMITTABLE, TaskState
from jobbers_celery.store import RedisStore
from tests.integration.store_helpers import NAME
from tests.integration.unique_cases import WID, digest, publish, start, state_of, uq

pytestmark = [
    pytest.mark.redis,
    pytest.mark.xfail(
        strict=True,
        raises=AssertionError,
        reason="pending: uniq.lua 'free' compares the task id only, so a late delete "
        "removes the lock a resubmit of the same id took meanwhile",
    ),
]

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
