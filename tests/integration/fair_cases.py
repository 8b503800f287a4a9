"""Fair-share rules every store keeps (the Redis store on one and on several shards, and the
in-memory kit): run by tests/unit/test_fair_shares.py on the kit and by
tests/integration/test_fair_store.py on Redis."""

from __future__ import annotations

from typing import Any

from jobbers_celery.core.fairshare import FairKey, key_digest
from jobbers_celery.core.states import TaskState

S = TaskState
NAME = "fair.n"
A = FairKey(key_digest("tenant-a"), 2)
B = FairKey(key_digest("tenant-b"), 2)


def publish(store: Any, task_id: str, key: FairKey | None = None) -> TaskState:
    """A publish; with ``key``, under fair shares (parked when its key has no room)."""
    res = store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name=NAME,
                       create={"name": NAME, "queue": "q", "msg": "{}"}, fair=key)
    assert res.applied, res
    return res.state


def start(store: Any, task_id: str, key: FairKey) -> TaskState:
    res = store.start(task_id, name=NAME, worker="w@h", wid="w@h:1:a", heartbeat_ms=None,
                      cap=key.cap, lease_cap_ms=60_000, defer_ms=1000, fields={}, fair=key)
    return res.state


def complete(store: Any, task_id: str) -> None:
    record = store.get(task_id)
    res = store.complete(task_id, record.attempt, name=NAME, worker="w@h", wid="w@h:1:a",
                         fields={}, delete=(), write_result=None)
    assert res.applied, res


def release(store: Any) -> list[str]:
    """The release pass and the claim the scheduler makes of what it releases."""
    released = store.fair_release().ids
    claimed = store.claim(list(released), 60_000, "w@h", released)
    got = {c.task_id for c in claimed}
    store.fair_unreleased([(i, *released[i]) for i in released if i not in got])
    store.confirm_published(got)
    return [c.task_id for c in claimed]


def reasons(store: Any, task_id: str) -> list[str]:
    return [t.reason or "" for t in store.history(task_id)]


def case_publish_parks_past_the_room_and_releases_in_order(store: Any) -> None:
    """A key's first ``cap`` publishes go; the others are parked (no message), first in
    first out; each end releases the oldest parked one, never a later publish first."""
    states = [publish(store, f"a{i}", A) for i in range(5)]
    assert states == [S.SUBMITTED, S.SUBMITTED, S.SCHEDULED, S.SCHEDULED, S.SCHEDULED]
    assert reasons(store, "a2")[-1] == A.parked_reason
    assert publish(store, "b0", B) is S.SUBMITTED  # another key has its own room
    assert release(store) == []  # a0 and a1 are on their way: no room
    assert start(store, "a0", A) is S.STARTED
    assert start(store, "a1", A) is S.STARTED
    assert release(store) == []
    complete(store, "a0")
    assert release(store) == ["a2"]
    assert reasons(store, "a2")[-1] == "released: its key has room (fair share)"
    assert publish(store, "a9", A) is S.SCHEDULED  # behind the parked ones
    assert start(store, "a2", A) is S.STARTED
    complete(store, "a1")
    complete(store, "a2")
    assert release(store) == ["a3", "a4"]
    held = {h.digest: h for h in store.fair_held()}
    assert (held[A.digest].parked, held[A.digest].released, held[A.digest].cap) == (1, 2, 2)
    assert held[A.digest].key == A.digest[:8]
    assert held[A.digest].name == NAME
    assert B.digest not in held  # nothing of it is parked


def case_start_parks_an_unthrottled_publish_past_the_cap(store: Any) -> None:
    """A publish that was not throttled (by name, a canvas member) is parked at its start
    when its key is full, and released when it has room."""
    for i in range(3):
        publish(store, f"p{i}")
    assert [start(store, f"p{i}", A) for i in range(3)] == [S.STARTED, S.STARTED,
                                                            S.SCHEDULED]
    assert reasons(store, "p2")[-1] == A.parked_reason
    record = store.get("p2")
    assert record.attempt == 0
    assert record.retry_attempt == 0
    complete(store, "p0")
    assert release(store) == ["p2"]
    assert start(store, "p2", A) is S.STARTED


def case_a_cancelled_parked_task_is_skipped(store: Any) -> None:
    """A parked task cancelled meanwhile is not published; the next one is."""
    for i in range(4):
        publish(store, f"c{i}", A)
    assert store.cancel("c2", "by test").outcome == "cancelled"
    start(store, "c0", A)
    start(store, "c1", A)
    complete(store, "c0")
    assert release(store) == []  # c2 was next: cancelled, skipped (its room freed)
    assert release(store) == ["c3"]


def case_a_refused_publish_holds_no_place_of_its_key(store: Any) -> None:
    """A fair-share publish whose step is refused (a unique task's duplicate, an id
    recorded already) takes none of its key's places; an id recorded already keeps the one
    its first publish took (the sharded layout counted a refused one for 5 minutes, found
    by review)."""
    from jobbers_celery.core.unique import Unique, field_value
    from jobbers_celery.core.unique import key_digest as unique_digest

    spec = Unique()
    field = field_value(spec, unique_digest(NAME, spec, ["same"], {}))

    def submit(task_id: str, uq: str | None = None) -> Any:
        create = {"name": NAME, "queue": "q", "msg": "{}", **({"uq": uq} if uq else {})}
        return store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name=NAME,
                            create=create, fair=A)

    assert submit("u1", field).state is S.SUBMITTED
    assert not submit("u2", field).applied  # the unique duplicate: refused
    assert not submit("u1", field).applied  # the same id again: refused, keeps its place
    assert publish(store, "u3", A) is S.SUBMITTED  # u1 and u3: the key's 2 places
    assert publish(store, "u4", A) is S.SCHEDULED  # parked


def case_a_bulk_publish_parks_its_members_past_the_room(store: Any) -> None:
    """A group's members in one batch (``submit_many``, as a bulk publish writes them),
    under fair shares: each step sees the places the ones before it in the batch took, so a
    key's first ``cap`` members go and the rest are parked, another key's members have their
    own room; released first in first out in the batch's order (not the ids' order: a batch
    parks many in one millisecond); a refused member (its id recorded already) holds no
    place of its key."""
    from jobbers_celery.store import Submission

    def member(task_id: str, key: FairKey) -> Submission:
        return Submission(task_id, NAME, {"name": NAME, "queue": "q", "msg": "{}"},
                          {"msg": "{}"}, fair=key)

    publish(store, "d0")  # recorded before, outside fair shares
    c = FairKey(key_digest("tenant-c"), 1)
    ids = ["z0", "y1", "h0", "x2", "w3", "h1", "v4", "h2", "u5", "d0"]
    keys = [A, A, B, A, A, B, A, B, A, c]
    results = store.submit_many([member(i, k) for i, k in zip(ids, keys, strict=True)]).results()
    assert [r.state for r in results[:-1]] == [
        S.SUBMITTED, S.SUBMITTED, S.SUBMITTED, S.SCHEDULED, S.SCHEDULED, S.SUBMITTED,
        S.SCHEDULED, S.SCHEDULED, S.SCHEDULED]
    assert not results[-1].applied  # d0: recorded already, refused
    assert reasons(store, "x2")[-1] == A.parked_reason
    (late,) = store.submit_many([member("c1", c)]).results()
    assert late.state is S.SUBMITTED  # the refused d0 took none of c's one place
    assert start(store, "z0", A) is S.STARTED
    assert start(store, "y1", A) is S.STARTED
    complete(store, "z0")
    assert release(store) == ["x2"]
    complete(store, "y1")
    assert start(store, "x2", A) is S.STARTED
    assert release(store) == ["w3"]
    complete(store, "x2")
    assert start(store, "w3", A) is S.STARTED
    assert release(store) == ["v4"]
    held = {h.digest: h for h in store.fair_held()}
    assert held[A.digest].parked == 1  # u5
    assert held[B.digest].parked == 1  # h2


def _next_ms(store: Any) -> None:
    """Wait until the store's clock is past the current millisecond: what happens next is
    later, never tied with what happened before."""
    from tests.conftest import wait_for

    now = store.now_ms()
    wait_for(lambda: store.now_ms() > now, timeout=5, message="the next millisecond")


def case_a_task_parked_again_keeps_its_place(store: Any) -> None:
    """A task released whose key is full again when it starts (its release stopped counting:
    expired, its message late) is parked again at the place it first had: released before
    a task parked after its first park, not behind it (one shard placed it by submission,
    the sharded layout at the back, the kit appended it: found by review)."""
    states = [publish(store, f"k{i}", A) for i in range(4)]
    assert states == [S.SUBMITTED, S.SUBMITTED, S.SCHEDULED, S.SCHEDULED]
    assert start(store, "k0", A) is S.STARTED
    assert start(store, "k1", A) is S.STARTED
    complete(store, "k0")
    assert release(store) == ["k2"]
    store.fair_unreleased([("k2", NAME, A.digest)])  # k2's release stops counting
    assert release(store) == ["k3"]  # its room went to the next one
    assert start(store, "k3", A) is S.STARTED
    _next_ms(store)
    assert publish(store, "k4", A) is S.SCHEDULED  # parked after k2 first was
    assert start(store, "k2", A) is S.SCHEDULED  # k1 and k3 run: parked again
    assert reasons(store, "k2")[-1] == A.parked_reason
    assert store.get("k2").attempt == 0
    complete(store, "k1")
    assert release(store) == ["k2"]  # back at its place: ahead of k4
    assert start(store, "k2", A) is S.STARTED
    complete(store, "k3")
    assert release(store) == ["k4"]


def case_a_task_first_parked_at_its_start_is_placed_by_its_submission(store: Any) -> None:
    """A task published without the key's check (by name, a canvas member) and parked at
    its start goes ahead of the tasks parked since it was submitted, in every layout (the
    sharded layout put it at the back: found by review)."""
    publish(store, "s0")  # not held at its publish
    _next_ms(store)
    states = [publish(store, f"t{i}", A) for i in range(3)]
    assert states == [S.SUBMITTED, S.SUBMITTED, S.SCHEDULED]
    assert start(store, "t0", A) is S.STARTED
    assert start(store, "t1", A) is S.STARTED
    assert start(store, "s0", A) is S.SCHEDULED  # full: parked, by its submission
    complete(store, "t0")
    assert release(store) == ["s0"]
    assert start(store, "s0", A) is S.STARTED
    complete(store, "t1")
    assert release(store) == ["t2"]


def case_a_parked_task_come_due_is_published_once_and_no_longer_parked(store: Any) -> None:
    """A parked task at the head of its key's list whose backstop came before a release
    pass visited its key, published by the scheduler's submit step (``scheduled ->
    submitted`` under fair shares) while its key has room: it leaves the parked list (it
    counted as parked and on its way, held the key's next publishes back, and a release
    pass released it again, whose unclaim then gave back its place while its message was
    on its way: found by review)."""
    states = [publish(store, f"d{i}", A) for i in range(3)]
    assert states == [S.SUBMITTED, S.SUBMITTED, S.SCHEDULED]
    for i in (0, 1):
        assert start(store, f"d{i}", A) is S.STARTED
        complete(store, f"d{i}")
    res = store.submit("d2", sources=(S.SCHEDULED,), reason="run_at reached", name=NAME,
                       lease_ms=60_000, fair=A, ret=("msg", "retries", "queue"))
    assert res.state is S.SUBMITTED
    store.confirm_published(["d2"])
    assert all(h.parked == 0 for h in store.fair_held())  # nothing parked any more
    assert release(store) == []  # not released again
    assert publish(store, "d3", A) is S.SUBMITTED  # d2 on its way + d3: the cap
    assert publish(store, "d4", A) is S.SCHEDULED
