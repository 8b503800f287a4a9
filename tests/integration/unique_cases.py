"""Unique tasks' locks follow their task, as store-level cases run on 1, 4 and 16 shards
(test_unique_shards.py) and on a real Redis Cluster (test_on_cluster.py): a stall recovery
and a manual resubmit take the lock again, with a fresh expiry (on several shards the lock
is in the global slot, out of the steps' reach: ``uniq.lua``, then the step); a stall
verdict, a cancel, a purge of a waiting copy and a member published into a cancelled
workflow delete the lock key (not only count it free); a recovery another copy's lock
refuses leaves the task stalled and dead-letters it; a refused resubmit leaves the lock's
expiry as it was; the store going away around the global slot's calls (a delete, a take, a
lost reply) loses no verdict: what applied is reported, what did not is judged again. Each
case takes an empty store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import redis

from jobbers_celery.core.states import RESUBMITTABLE, TaskState
from jobbers_celery.core.unique import Unique, Until, field_value, key_digest
from jobbers_celery.store import RedisStore
from tests.integration.store_helpers import NAME, QUEUE

S = TaskState
WID = "wid-uq"
#: A window long enough not to end during a case.
WINDOW_S = 600.0


def uq(until: Until = Until.END, key: str = "k") -> str:
    spec = Unique(until=until, ttl=WINDOW_S if until is Until.WINDOW else None)
    return field_value(spec, key_digest(NAME, spec, [key], {}))


def digest(field: str) -> str:
    return field.split(":")[2]


def lock(store: RedisStore, field: str) -> str:
    return store.keys.unique(digest(field))


def publish(store: RedisStore, task_id: str, field: str) -> Any:
    return store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name=NAME,
                        create={"name": NAME, "queue": QUEUE, "uq": field, "dlq": "1"},
                        fields={"msg": '{"args": [], "kwargs": {}, "options": {}}',
                                "retries": "0"})


def start(store: RedisStore, task_id: str, srec: int = 1, cap: int | None = None) -> None:
    res = store.step(task_id, S.STARTED, start=True, worker="w@h", wid=WID, name=NAME,
                     cap=cap, set_fields={"srec": str(srec)})
    assert res.state is S.STARTED, res


def stall(store: RedisStore, task_id: str) -> Any:
    """The cleaner's verdict on ``task_id`` (its worker says it does not run it)."""
    verdict = store.stall([(task_id, "gone", WID, NAME)], 60_000, 30_000)
    assert verdict.stalled == 1, verdict
    return verdict


def state_of(store: RedisStore, task_id: str) -> TaskState | None:
    record = store.get(task_id)
    return None if record is None else record.state


def fresh(store: RedisStore, field: str) -> bool:
    """The lock was (re)taken just now: its expiry is (about) whole."""
    return int(store.client.pttl(lock(store, field))) > int(field.split(":")[1]) - 60_000


def no_stray_locks(store: RedisStore, field: str) -> None:
    """Sharded: no lock under a shard's tag (only the global slot holds locks)."""
    if store.sharded:
        assert not any(store.client.exists(k.unique(digest(field))) for k in store.shards.keys)


def case_a_stall_recovery_holds_the_lock_until_the_recovered_copy_ends(
        store: RedisStore) -> None:
    """The cleaner's automatic recovery (stalled -> submitted) takes the lock again, with
    a fresh expiry: a duplicate is refused naming the recovered copy while it waits (and,
    until end or for a window, while it runs), and the lock goes at its point."""
    for until in Until:
        a, b = f"a-{until}", f"b-{until}"
        field = uq(until, key=str(until))
        assert publish(store, a, field).applied
        start(store, a)
        if until is Until.START:
            assert store.client.exists(lock(store, field)) == 0  # freed at the start
        else:
            assert store.client.pexpire(lock(store, field), 1_000)  # near its expiry
        verdict = stall(store, a)
        assert [i["id"] for i in verdict.recovered] == [a], until
        assert verdict.dead == []
        assert state_of(store, a) is S.SUBMITTED
        assert store.unique_holder(digest(field)) == a, until
        assert publish(store, b, field).why == f"duplicate:{a}", until
        assert fresh(store, field), until
        no_stray_locks(store, field)
        start(store, a)
        if until is Until.START:
            assert publish(store, b, field).applied
            continue
        assert publish(store, b, field).why == f"duplicate:{a}"
        assert store.step(a, S.COMPLETED, fence=2, wid=WID, name=NAME).applied
        if until is Until.WINDOW:
            assert publish(store, b, field).why == f"duplicate:{a}"  # the window outlives it
            continue
        assert store.client.exists(lock(store, field)) == 0
        assert publish(store, b, field).applied


def case_a_manual_resubmit_takes_the_lock_again_with_a_fresh_expiry(
        store: RedisStore) -> None:
    """The DLQ's, the API's and the CLI's resubmit (``Recorder.resubmit``: a step to
    submitted from a finished state): held by the resubmitted copy, its expiry anew."""
    for until in (Until.END, Until.WINDOW):
        a, b = f"a-{until}", f"b-{until}"
        field = uq(until, key=str(until))
        assert publish(store, a, field).applied
        start(store, a)
        assert store.step(a, S.FAILED, fence=1, wid=WID, name=NAME, reason="boom").applied
        if until is Until.END:
            assert store.client.exists(lock(store, field)) == 0  # freed at its end
        else:
            assert store.client.pexpire(lock(store, field), 1_000)  # near its end
        again = store.submit(a, sources=RESUBMITTABLE, lease_ms=30_000, reason="resubmitted")
        assert again.applied
        assert store.unique_holder(digest(field)) == a
        assert fresh(store, field), until
        assert publish(store, b, field).why == f"duplicate:{a}"
        no_stray_locks(store, field)


def case_a_stall_without_recovery_deletes_the_lock_and_the_lease(store: RedisStore) -> None:
    """A stalled copy out of recoveries ends for good: its until=end lock key is deleted
    (not left to expire), and a capped copy's max_concurrent lease is released too."""
    field = uq()
    assert publish(store, "a", field).applied
    start(store, "a", srec=0, cap=2)
    assert store.client.zcard(store.keys.concurrency(NAME)) == 1
    verdict = stall(store, "a")
    assert [i["id"] for i in verdict.dead] == ["a"]
    assert store.client.exists(lock(store, field)) == 0
    assert store.client.zcard(store.keys.concurrency(NAME)) == 0
    assert store.unique_holder(digest(field)) is None
    assert publish(store, "b", field).applied


def case_a_recovery_another_copy_holds_the_lock_of_is_refused(store: RedisStore) -> None:
    """The lock expired while the copy ran and another copy took it: the stalled copy is
    not resubmitted (that would be the duplicate the lock exists to prevent); it stays
    stalled and goes with the dead (dead-lettered), its reason saying why."""
    field = uq()
    assert publish(store, "a", field).applied
    start(store, "a")
    store.client.delete(lock(store, field))  # expired
    assert publish(store, "b", field).applied
    verdict = stall(store, "a")
    assert verdict.recovered == []
    assert [i["id"] for i in verdict.dead] == ["a"]
    assert verdict.dead[0]["reason"].endswith("not resubmitted: duplicate:b")
    assert verdict.dead[0]["dlq"] == "1"
    assert state_of(store, "a") is S.STALLED
    assert store.unique_holder(digest(field)) == "b"
    no_stray_locks(store, field)


def case_a_cancel_or_purge_of_a_waiting_copy_deletes_its_lock(store: RedisStore) -> None:
    for until in Until:
        a, b, c = f"a-{until}", f"b-{until}", f"c-{until}"
        field = uq(until, key=str(until))
        assert publish(store, a, field).applied
        assert store.cancel(a, "not wanted").outcome == "cancelled"
        assert store.client.exists(lock(store, field)) == 0, until
        assert publish(store, b, field).applied
        store.purge(NAME, None, None)  # cancels b with the same step
        assert store.client.exists(lock(store, field)) == 0, until
        assert publish(store, c, field).applied


def case_a_member_of_a_cancelled_workflow_frees_its_lock(store: RedisStore) -> None:
    """A unique member published after its workflow was cancelled is cancelled by its own
    publish step: the lock it took is deleted at once, and the next copy is accepted."""
    field = uq()
    store.mark_workflow_cancelled("root-1", True)
    res = store.submit("m1", sources=(S.UNSUBMITTED,), reason="published", name=NAME,
                       create={"name": NAME, "queue": QUEUE, "uq": field, "wf": "root-1"},
                       fields={"msg": "{}"})
    assert res.applied
    assert res.state is S.CANCELLED
    assert store.client.exists(lock(store, field)) == 0
    assert publish(store, "b", field).applied


@contextmanager
def failing_uniq(store: RedisStore, ops: tuple[str, ...],
                 error: Callable[[], BaseException] = lambda: redis.ConnectionError("failover")
                 ) -> Iterator[None]:
    """Sharded: the global slot's lock calls ``ops`` (uniq.lua's first argument) raise
    ``error`` (its master failing over; the cleaner's process dying) while inside."""
    real = store._scripts["uniq"]

    def call(keys: list[str], args: list[Any]) -> Any:
        if args[0] in ops:
            raise error()
        return real(keys=keys, args=args)

    store._scripts["uniq"] = cast(Any, call)
    try:
        yield
    finally:
        store._scripts["uniq"] = real


def case_a_verdict_or_cancel_stands_when_the_lock_delete_fails(store: RedisStore) -> None:
    """The stall verdict applied (its step ran in the task's shard): the lock key's delete
    in the global slot failing after it (a failover there) loses the delete only, never
    the verdict; a cancel of a waiting copy is reported cancelled, and a purge goes on."""
    field = uq()
    assert publish(store, "a", field).applied
    start(store, "a", srec=0)
    with failing_uniq(store, ("free",)):
        verdict = stall(store, "a")
    assert [i["id"] for i in verdict.dead] == ["a"]
    assert state_of(store, "a") is S.STALLED
    assert store.unique_holder(digest(field)) is None  # a stale key counts as free
    assert publish(store, "b", field).applied
    with failing_uniq(store, ("free",)):
        assert store.cancel("b", "not wanted").outcome == "cancelled"
    assert publish(store, "c", field).applied
    assert publish(store, "d", uq(key="other")).applied
    with failing_uniq(store, ("free",)):
        _, cancelled, _ = store.purge(NAME, None, None)
    assert sorted(cancelled) == ["c", "d"]
    assert publish(store, "e", field).applied


def case_a_refused_resubmit_keeps_the_lock_expiry(store: RedisStore) -> None:
    """A resubmit refused (the copy still runs: ``state``; its payload dropped:
    ``no_msg``) leaves the lock's expiry as it was: a window is not made longer by a
    resubmit that did not happen (as on one Redis, where the step takes the lock after its
    checks). One that applies renews it."""
    a, field = "a", uq(Until.WINDOW)
    assert publish(store, a, field).applied
    start(store, a)
    assert store.client.pexpire(lock(store, field), 5_000)

    def resubmit() -> Any:
        return store.submit(a, sources=RESUBMITTABLE, lease_ms=30_000, reason="resubmitted",
                            ret=("msg",), need="msg")

    assert resubmit().why == "state"
    assert 0 < int(store.client.pttl(lock(store, field))) <= 5_000
    assert store.step(a, S.FAILED, fence=1, wid=WID, name=NAME, reason="boom").applied
    store.client.hdel(store.keys_of(a).task(a), "msg")
    assert resubmit().why == "no_msg"
    assert 0 < int(store.client.pttl(lock(store, field))) <= 5_000
    store.client.hset(store.keys_of(a).task(a), "msg", "{}")
    assert resubmit().applied
    assert fresh(store, field)


def case_a_recovery_whose_lock_take_fails_is_judged_again(store: RedisStore) -> None:
    """Sharded, the recovery's lock is taken in the global slot before the script that
    stalls and resubmits the task: a take that fails (a failover there) or a cleaner that
    dies before that script leaves the task started, and the next pass recovers it (not
    stalled for good, never resubmitted nor dead-lettered)."""
    for n, error in enumerate((lambda: redis.ConnectionError("failover"),
                               lambda: KeyboardInterrupt())):
        a, field = f"a{n}", uq(key=str(n))
        assert publish(store, a, field).applied
        start(store, a)
        with failing_uniq(store, ("take", "swap", "again"), error):  # again: its old name
            try:
                verdict = store.stall([(a, "gone", WID, NAME)], 60_000, 30_000)
            except KeyboardInterrupt:  # the cleaner died
                verdict = None
        if state_of(store, a) is S.STARTED:  # sharded: the next pass judges it
            assert verdict is None or (verdict.stalled, verdict.dead) == (0, [])
            verdict = stall(store, a)
        assert verdict is not None
        assert [i["id"] for i in verdict.recovered] == [a]
        assert verdict.dead == []
        assert state_of(store, a) is S.SUBMITTED
        assert store.unique_holder(digest(field)) == a
        assert fresh(store, field)
        no_stray_locks(store, field)


@contextmanager
def lost_reply_after_the_verdict(store: RedisStore, task_id: str) -> Iterator[list[int]]:
    """Any call after the first stall verdict's script that leaves ``task_id`` out of
    started (the recovery, on the sharded layout) runs, then raises as if its reply was
    lost (once). Yields the number of replies lost."""
    calls, lost = [0], [0]
    real_stall, real_transition = store._scripts["stall"], store._transition

    def after(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        out = real(*args, **kwargs)
        if calls[0] > 1 and not lost[0] and state_of(store, task_id) is not S.STARTED:
            lost[0] += 1
            raise redis.ConnectionError("reply lost")
        return out

    store._scripts["stall"] = cast(Any, lambda **kw: after(real_stall, **kw))
    store._transition = cast(Any, lambda *a: after(real_transition, *a))
    try:
        yield lost
    finally:
        store._scripts["stall"] = real_stall
        store._transition = real_transition


def case_a_lost_reply_of_a_recovery_is_read_back(store: RedisStore) -> None:
    """The reply of the call that resubmits a stalled unique copy is lost (sharded): the
    store applied it (the record is submitted with a publish lease), so the task is
    counted recovered, not dead-lettered (it would run and sit in the DLQ too); a recovery
    that was refused (another copy took the lock) is read back as dead-lettered."""
    field = uq()
    assert publish(store, "a", field).applied
    start(store, "a")
    with lost_reply_after_the_verdict(store, "a") as lost:
        verdict = stall(store, "a")
    assert lost[0] == (1 if store.sharded else 0)
    assert [i["id"] for i in verdict.recovered] == ["a"]
    assert verdict.dead == []
    assert state_of(store, "a") is S.SUBMITTED
    assert store.unique_holder(digest(field)) == "a"
    start(store, "a", srec=2)
    store.client.delete(lock(store, field))  # expired
    assert publish(store, "b", field).applied
    with lost_reply_after_the_verdict(store, "a"):
        verdict = stall(store, "a")
    assert verdict.recovered == []
    assert [i["id"] for i in verdict.dead] == ["a"]
    assert verdict.dead[0]["reason"].endswith("not resubmitted: duplicate:b")
    assert state_of(store, "a") is S.STALLED
    assert store.unique_holder(digest(field)) == "b"


def case_a_recovery_whose_outcome_is_unknown_keeps_its_lock(store: RedisStore) -> None:
    """The reply of the call that resubmits a stalled unique copy is lost and its record
    cannot be read back (sharded): the lock just taken for it is kept, since the script
    did apply (the copy is submitted and is published again); deleting it would let a new
    publish of its key in while the copy runs (found by review)."""
    from jobbers_celery.store import reads

    field = uq()
    assert publish(store, "a", field).applied
    start(store, "a")
    store.client.delete(lock(store, field))  # expired: the recovery takes it anew
    real_fields = reads.fields
    with lost_reply_after_the_verdict(store, "a") as lost:
        def unreadable(*args: Any, **kwargs: Any) -> Any:
            if lost[0]:
                raise redis.ConnectionError("store gone")
            return real_fields(*args, **kwargs)

        reads.fields = cast(Any, unreadable)
        try:
            verdict = store.stall([("a", "gone", WID, NAME)], 60_000, 30_000)
        finally:
            reads.fields = real_fields
    assert lost[0] == (1 if store.sharded else 0)
    assert verdict.dead == []
    assert state_of(store, "a") is S.SUBMITTED
    assert store.unique_holder(digest(field)) == "a"
    assert publish(store, "b", field).why == "duplicate:a"
    no_stray_locks(store, field)


CASES = [
    case_a_stall_recovery_holds_the_lock_until_the_recovered_copy_ends,
    case_a_manual_resubmit_takes_the_lock_again_with_a_fresh_expiry,
    case_a_stall_without_recovery_deletes_the_lock_and_the_lease,
    case_a_recovery_another_copy_holds_the_lock_of_is_refused,
    case_a_cancel_or_purge_of_a_waiting_copy_deletes_its_lock,
    case_a_member_of_a_cancelled_workflow_frees_its_lock,
    case_a_verdict_or_cancel_stands_when_the_lock_delete_fails,
    case_a_refused_resubmit_keeps_the_lock_expiry,
    case_a_recovery_whose_lock_take_fails_is_judged_again,
    case_a_lost_reply_of_a_recovery_is_read_back,
    case_a_recovery_whose_outcome_is_unknown_keeps_its_lock,
]
