"""Any task id round-trips through the store's scan scripts and their replies (issue 24):
a reply that joined ids with a separator an id may hold (``due.lua``'s ``|``) stopped the
scheduler for every delayed task on every shard."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobbers_celery.core.states import TaskState
from tests.conftest import wait_for
from tests.integration.store_helpers import put_in_state, store_factory

S = TaskState

HOSTILE = ["|", "a|b", "||", "\n", "a\nb", ",", ":", "a:b:c", " ", " x ", "", "x" * 1000,
           "é|ü", "😀", "{tag}", "\r\n|\t", "*", "null", "[]", "{}", "1e5", "-0"]

#: Ids as publishers choose them: the separators an in-band reply would split on, weighted up.
IDS = st.sampled_from(HOSTILE) | st.text(
    st.sampled_from([*"|,:;{}[] \n\r\t\\\"'*é😀ab01"]) | st.characters(), max_size=40)


def _schedule(store, task_id: str, delay_ms: int = 1) -> None:
    put_in_state(store, task_id, S.STARTED)
    assert store.step(task_id, S.SCHEDULED, fence=1, delay_ms=delay_ms).applied


def _claimed(store, want: set[str]) -> set[str]:
    seen: set[str] = set()

    def all_due() -> bool:
        ids, _ = store.due()
        seen.update(ids)
        return want <= seen

    wait_for(all_due, message=f"{want - seen} to be due")
    return {c.task_id for c in store.claim(sorted(seen), 30_000, "w1@host")}


def _late(store) -> set[str]:
    """The ids a cleaner pass finds past their heartbeat deadline."""
    return {i for scan in store.cleaner_due((1000, 1000), 600_000, 500) for i in scan.hb}


def test_a_hostile_delayed_id_does_not_stop_the_scheduler(make_store) -> None:
    store = make_store()
    everyone = {*HOSTILE, "normal"}
    for task_id in HOSTILE:
        _schedule(store, task_id)
    _schedule(store, "normal")
    assert _claimed(store, everyone) == everyone
    assert store.due() == ([], None)
    # and through the cleaner's scan: started with a heartbeat deadline already past
    for task_id in everyone:
        assert store.step(task_id, S.STARTED, start=True, worker="w1@host",
                          heartbeat_ms=1).applied
    wait_for(lambda: _late(store) == everyone, message="every id past its deadline")


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task_id=IDS)
def test_any_id_round_trips_through_the_scans(redis_url, task_id) -> None:
    with store_factory(redis_url) as make:
        store = make()
        store.client.flushdb()
        _schedule(store, task_id)
        _schedule(store, "normal")
        assert _claimed(store, {task_id, "normal"}) == {task_id, "normal"}
        assert store.get(task_id).state == S.SUBMITTED
        put = store.step(task_id, S.STARTED, start=True, worker="w1@host", heartbeat_ms=1)
        assert put.applied

        wait_for(lambda: task_id in _late(store), message="the id past its deadline")
        assert [t.task_id for t in store.history(task_id)] == [task_id] * 5
