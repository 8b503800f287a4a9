"""Fair shares in the Redis store, without workers: the rules of
tests/integration/fair_cases.py on one shard (decided inside the steps) and on four (the
global slot first), and a parked task whose entry the store lost comes back at its
backstop."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from jobbers_celery.core.states import TaskState
from jobbers_celery.store import fairshare
from jobbers_celery.store.redis import RedisStore
from tests.conftest import wait_for
from tests.integration import fair_cases

pytestmark = [pytest.mark.redis]

CASES = [
    fair_cases.case_publish_parks_past_the_room_and_releases_in_order,
    fair_cases.case_start_parks_an_unthrottled_publish_past_the_cap,
    fair_cases.case_a_cancelled_parked_task_is_skipped,
    fair_cases.case_a_refused_publish_holds_no_place_of_its_key,
    fair_cases.case_a_bulk_publish_parks_its_members_past_the_room,
    fair_cases.case_a_parked_task_come_due_is_published_once_and_no_longer_parked,
    fair_cases.case_a_task_parked_again_keeps_its_place,
    fair_cases.case_a_task_first_parked_at_its_start_is_placed_by_its_submission,
]


@pytest.fixture(params=[1, 4], ids=["one-shard", "four-shards"])
def store(redis_url: str, request: pytest.FixtureRequest) -> RedisStore:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    return RedisStore(client, "fairstore", shards=request.param)


@pytest.mark.parametrize("case", CASES)
def test_the_redis_store_keeps_the_rules(store: RedisStore, case: Any) -> None:
    case(store)


def test_a_parked_task_whose_entry_was_lost_comes_back_at_its_backstop(
        store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that lost the key's list (writes lost in a restart) parks nothing for good:
    the task is published at its run_at backstop, and parked again while its key is full."""
    monkeypatch.setattr(fairshare, "PARK_BACKSTOP_MS", 300)
    A = fair_cases.A
    assert [fair_cases.publish(store, f"l{i}", A) for i in range(3)] == [
        TaskState.SUBMITTED, TaskState.SUBMITTED, TaskState.SCHEDULED]
    store.client.delete(store.keys.fair_parked(fair_cases.NAME, A.digest), store.keys.fair_index)
    assert fair_cases.release(store) == []  # nothing is known parked any more
    due = wait_for(lambda: "l2" in store.due()[0], timeout=5, message="l2's backstop")
    assert due
    assert [c.task_id for c in store.claim(["l2"], 60_000, "w@h")] == ["l2"]
    assert fair_cases.start(store, "l0", A) is TaskState.STARTED
    assert fair_cases.start(store, "l1", A) is TaskState.STARTED
    assert fair_cases.start(store, "l2", A) is TaskState.SCHEDULED  # full: parked again
    assert [h.parked for h in store.fair_held()] == [1]
    fair_cases.complete(store, "l0")
    assert fair_cases.release(store) == ["l2"]


def test_a_bulk_publish_whose_admits_fail_holds_no_place(
        store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sharded: the batch's admits ran in the global slot but their reply was lost (the
    connection dropped): the publish fails and every member is withdrawn, so no phantom
    holds a place of its key or heads its parked tasks (found by review)."""
    from jobbers_celery.store import Submission

    real = fairshare.admit_many

    def lost(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise redis.ConnectionError("reply lost")

    monkeypatch.setattr(fairshare, "admit_many", lost)
    A = fair_cases.A
    members = [Submission(f"m{i}", fair_cases.NAME,
                          {"name": fair_cases.NAME, "queue": "q", "msg": "{}"},
                          {"msg": "{}"}, fair=A) for i in range(3)]
    if store.sharded:
        with pytest.raises(redis.ConnectionError):
            store.submit_many(members)
    else:  # one shard: decided in the steps, no admit
        store.submit_many(members).results()
        return
    monkeypatch.setattr(fairshare, "admit_many", real)
    for key in (store.keys.fair_released(fair_cases.NAME, A.digest),
                store.keys.fair_parked(fair_cases.NAME, A.digest)):
        assert store.client.zcard(key) == 0, key
    assert [fair_cases.publish(store, f"n{i}", A) for i in range(3)] == [
        TaskState.SUBMITTED, TaskState.SUBMITTED, TaskState.SCHEDULED]


def test_a_release_whose_places_are_not_recorded_still_releases(
        store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release pass writes each released task's place on its record after the release
    applied: a store gone meanwhile loses the places (logged), never the release, whose
    tasks must still be published; such a task parked again is placed by its submission."""
    A = fair_cases.A
    assert [fair_cases.publish(store, f"g{i}", A) for i in range(3)] == [
        TaskState.SUBMITTED, TaskState.SUBMITTED, TaskState.SCHEDULED]
    fair_cases.start(store, "g0", A)
    fair_cases.complete(store, "g0")

    def gone(*args: Any, **kwargs: Any) -> Any:
        raise redis.ConnectionError("gone")

    monkeypatch.setattr(store, "_fan", gone)
    assert fair_cases.release(store) == ["g2"]
    assert store.client.hget(store.keys_of("g2").task("g2"), "fp") is None
