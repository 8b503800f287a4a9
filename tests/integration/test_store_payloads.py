"""RedisStore.drop_payloads and without_payload on a real Redis: a dead-lettered record
forgets its payload only while it is still dead at the dead-lettered attempt, keeps its
expiry, and goes back to Redis's compact encoding."""

from __future__ import annotations

import pytest

from jobbers_celery.core.states import TaskState
from tests.integration.store_helpers import put_in_state

pytestmark = pytest.mark.redis

S = TaskState
RETENTION = 3600
SLACK_MS = 3600 * 1000  # the store keeps terminal records an hour past the retention period


def test_a_dead_record_drops_its_payload_keeping_its_expiry(make_store):
    store = make_store(retention=RETENTION)
    client, key = store.client, store.keys_of("t1").task("t1")
    put_in_state(store, "t1", S.FAILED)
    client.hset(key, "msg", "x" * 10_000)  # a payload too long for the compact encoding
    assert client.object("encoding", key) == "hashtable"
    ttl = client.pttl(key)
    assert RETENTION * 1000 < ttl <= RETENTION * 1000 + SLACK_MS

    assert store.drop_payloads([("t1", 1)]) == 1
    assert not client.hexists(key, "msg")
    assert client.hget(key, "state") == "failed"
    assert client.object("encoding", key) == "listpack"
    assert ttl - 2000 < client.pttl(key) <= ttl  # the same expiry, not a new one
    assert store.drop_payloads([("t1", 1)]) == 0  # nothing left to drop


@pytest.mark.parametrize(("state", "attempt"), [
    (S.FAILED, 2),        # another attempt was dead-lettered: not this one's entry
    (S.SUBMITTED, 1),     # resubmitted meanwhile: its payload is needed to publish it
    (S.STARTED, 1),
    (S.CANCELLED, 1),     # no dead letter is written for a cancellation
])
def test_a_record_that_moved_on_keeps_its_payload(make_store, state, attempt):
    store = make_store()
    put_in_state(store, "t1", state)
    assert store.drop_payloads([("t1", attempt), ("missing", 1)]) == 0
    assert store.client.hexists(store.keys_of("t1").task("t1"), "msg")
    assert not store.client.exists(store.keys_of("missing").task("missing"))  # not created


def test_without_payload_names_the_resubmittable_records_that_dropped_it(make_store):
    store = make_store()
    for task_id, state in (("dropped", S.FAILED), ("kept", S.FAILED), ("stalled", S.STALLED),
                           ("running", S.STARTED)):
        put_in_state(store, task_id, state)
    store.drop_payloads([("dropped", 1), ("stalled", 1)])
    store.client.hdel(store.keys_of("running").task("running"), "msg")  # not resubmittable anyway
    assert store.without_payload(["dropped", "kept", "stalled", "running", "unknown"]) == {
        "dropped": 1, "stalled": 1}
    assert store.without_payload([]) == {}


def test_a_resubmit_needing_the_payload_is_refused_once_it_is_dropped(make_store):
    """``need="msg"``: the resubmit step reads the payload and refuses ``no_msg`` in the same
    script, so a payload dropped after a caller looked is never found missing after the
    step applied (the resubmitter then takes it from the dead letter)."""
    store = make_store()
    put_in_state(store, "t1", S.FAILED)
    store.drop_payloads([("t1", 1)])
    res = store.submit("t1", sources=(S.FAILED,), reason="resubmitted", ret=("msg", "name"),
                       need="msg", lease_ms=60_000)
    assert (res.applied, res.previous, res.why, res.attempt) == (False, "failed", "no_msg", 1)
    assert store.refused_counts().get("refused", 0) == 0  # not a refused transition
    put_in_state(store, "t2", S.FAILED)
    res = store.submit("t2", sources=(S.FAILED,), reason="resubmitted", ret=("msg", "name"),
                       need="msg", lease_ms=60_000)
    assert res.applied
    assert res.values["msg"]
