"""RedisStore against a real redis-server: the transition table, fencing, timestamps, indexes,
reads and pruning. No Celery worker involved."""

from __future__ import annotations

import itertools

import pytest

from jobbers_celery.core.records import from_ms
from jobbers_celery.core.states import (
    TERMINAL,
    TRANSITIONS,
    TaskState,
    allowed_from,
    can_transition,
)
from jobbers_celery.store.scripts import EXPIRY_SLACK_S as _EXPIRY_SLACK_S
from tests.conftest import wait_for
from tests.integration.store_helpers import (
    NAME,
    QUEUE,
    assert_indexed_only_in,
    create,
    indexed_states,
    put_in_state,
    snapshot,
    step_kwargs,
)

pytestmark = pytest.mark.redis


S = TaskState
ALL_PAIRS = list(itertools.product(TaskState, TaskState))


def _ms(store) -> int:
    """Redis server time, read independently of the store (``TIME``)."""
    sec, usec = store.client.time()
    return int(sec) * 1000 + int(usec) // 1000


def _next_ms(store, after: int) -> int:
    """Poll the Redis clock until it has moved past ``after`` (distinct index scores)."""
    return wait_for(lambda: (now := _ms(store)) > after and now, timeout=2,
                    message="the Redis clock to advance")


# --------------------------------------------------------------------------- the table


def test_table_and_sources_agree() -> None:
    assert set(TRANSITIONS) == set(TaskState)
    for src, dst in ALL_PAIRS:
        assert can_transition(src, dst) == (src in allowed_from(dst)), (src, dst)
    for state in TERMINAL:
        assert can_transition(S.STARTED, state)
    assert not TRANSITIONS[S.COMPLETED]


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_every_pair_lua_agrees_with_table(make_store, src: TaskState, dst: TaskState) -> None:
    store = make_store()
    put_in_state(store, "t1", src)
    put_in_state(store, "other", S.STARTED)  # an unrelated record must never be touched
    before = snapshot(store, "t1")
    other_before = snapshot(store, "other")
    refused_before = store.refused_counts()

    res = store.step("t1", dst, **step_kwargs(dst))

    assert res.applied == can_transition(src, dst), res
    assert res.previous == src.value
    after = snapshot(store, "t1")
    assert snapshot(store, "other") == other_before
    if res.applied:
        assert res.why is None
        assert after["hash"]["state"] == dst.value
        assert len(after["history"]) == len(before["history"]) + 1
        last = store.history("t1")[-1]
        assert (last.from_state, last.to_state) == (src, dst)
        assert_indexed_only_in(store, "t1", dst)
        assert store.refused_counts() == refused_before
    else:
        assert res.why == "state"
        assert after == before  # hash, history, TTLs and every index entry unchanged
        refused = store.refused_counts()
        assert refused.get("refused", 0) == refused_before.get("refused", 0) + 1
        kind = f"refused:{src.value}>{dst.value}"
        assert refused.get(kind, 0) == refused_before.get(kind, 0) + 1


def test_missing_record_is_only_created_by_submitted_with_create(make_store) -> None:
    store = make_store()
    for dst in TaskState:
        res = store.step("ghost", dst, **step_kwargs(dst))
        assert not res.applied
        assert res.previous == "missing"
        # missing counts as unsubmitted: only ->submitted passes the state check
        assert res.why == ("missing" if dst == S.SUBMITTED else "state")
    assert store.get("ghost") is None
    assert store.history("ghost") == []
    assert not store.client.exists(store.keys_of("ghost").task("ghost"))
    assert indexed_states(store, "ghost") == set()
    assert store.client.zscore(store.keys_of("ghost").all_tasks, "ghost") is None
    refused = store.refused_counts()
    assert refused["refused"] == len(TaskState)
    assert refused["refused:unsubmitted>submitted"] == 1

    res = create(store, "ghost")
    assert res.previous == "missing"
    assert store.get("ghost").state == S.SUBMITTED


def test_create_fields_are_only_written_for_a_new_record(make_store) -> None:
    store = make_store()
    put_in_state(store, "t1", S.UNSUBMITTED)
    res = store.step("t1", S.SUBMITTED, create={"name": "other.name", "queue": "other"},
                     name="other.name")
    assert res.applied
    assert res.previous == "unsubmitted"
    record = store.get("t1")
    assert (record.name, record.queue) == (NAME, QUEUE)
    assert store.client.zscore(store.keys_of("t1").name_index("other.name"), "t1") is None


def test_sources_guard_rejects_sources_outside_the_table(make_store) -> None:
    store = make_store()
    put_in_state(store, "t1", S.SUBMITTED)
    before = snapshot(store, "t1")
    for dst in TaskState:
        outside = set(TaskState) - allowed_from(dst)
        for src in outside:
            with pytest.raises(ValueError, match="not in the transition table"):
                store.step("t1", dst, sources=(src,))
        with pytest.raises(ValueError, match="not in the transition table"):
            store.step("t1", dst, sources=(*allowed_from(dst), *outside))
    assert snapshot(store, "t1") == before
    assert store.refused_counts() == {}


def test_narrowed_sources_refuse_other_table_sources(make_store) -> None:
    store = make_store()
    put_in_state(store, "t1", S.SUBMITTED)
    before = snapshot(store, "t1")
    res = store.step("t1", S.CANCELLED, sources=(S.SCHEDULED, S.STARTED))
    assert not res.applied
    assert res.why == "state"
    assert snapshot(store, "t1") == before
    assert store.step("t1", S.CANCELLED, sources=(S.SUBMITTED,)).applied


# --------------------------------------------------------------------------- fencing, times


def test_stale_fence_is_refused(make_store) -> None:
    store = make_store()
    put_in_state(store, "t1", S.STARTED)
    assert store.get("t1").attempt == 1
    for stale in (0, 2, 7):
        before = snapshot(store, "t1")
        res = store.step("t1", S.COMPLETED, fence=stale)
        assert not res.applied
        assert res.why == "stale_attempt"
        assert res.attempt == 1
        assert snapshot(store, "t1") == before
    assert store.refused_counts()["refused:started>completed"] == 3

    # a second start (after a requeue) makes attempt 1 stale
    assert store.step("t1", S.UNSUBMITTED, fence=1).applied
    assert store.step("t1", S.SUBMITTED).applied
    res = store.step("t1", S.STARTED, start=True, fence=1)
    assert res.applied
    assert res.attempt == 2
    late = store.step("t1", S.FAILED, fence=1)
    assert not late.applied
    assert late.why == "stale_attempt"
    assert store.get("t1").state == S.STARTED
    done = store.step("t1", S.COMPLETED, fence=2)
    assert done.applied
    assert done.attempt == 2


def test_start_counts_attempts_and_stamps_times(make_store) -> None:
    store = make_store()
    t0 = _ms(store)
    sub = create(store, "t1")
    t1 = _ms(store)
    assert t0 <= sub.now_ms <= t1
    raw = store.get_raw("t1")
    assert int(raw["sub_at"]) == sub.now_ms
    assert "start_at" not in raw
    assert "retry_at" not in raw
    assert raw["attempt"] == "0"

    t0 = _ms(store)
    first = store.step("t1", S.STARTED, start=True, worker="w1@host")
    t1 = _ms(store)
    assert first.applied
    assert first.attempt == 1
    raw = store.get_raw("t1")
    assert t0 <= int(raw["start_at"]) <= t1
    assert int(raw["hb_at"]) == int(raw["start_at"]) == first.now_ms
    assert "retry_at" not in raw
    assert raw["worker"] == "w1@host"
    started_at = int(raw["start_at"])

    # requeue immediately, then start again: retried_at, not started_at, moves
    assert store.step("t1", S.UNSUBMITTED, fence=1, reason="retry").applied
    assert store.step("t1", S.SUBMITTED).applied
    _next_ms(store, first.now_ms)
    t0 = _ms(store)
    second = store.step("t1", S.STARTED, start=True, worker="w2@host")
    t1 = _ms(store)
    assert second.attempt == 2
    raw = store.get_raw("t1")
    assert int(raw["start_at"]) == started_at
    assert t0 <= int(raw["retry_at"]) <= t1
    assert int(raw["hb_at"]) == second.now_ms > started_at

    # a delayed retry, then a third start
    assert store.step("t1", S.SCHEDULED, fence=2, delay_ms=0).applied
    assert store.step("t1", S.SUBMITTED).applied
    _next_ms(store, second.now_ms)
    third = store.step("t1", S.STARTED, start=True, worker="w3@host")
    assert third.attempt == 3
    record = store.get("t1")
    assert record.attempt == 3
    assert record.started_at == from_ms(started_at)
    assert record.retried_at == from_ms(third.now_ms)
    assert record.worker == "w3@host"
    assert [t.attempt for t in store.history("t1")] == [0, 1, 1, 1, 2, 2, 2, 3]


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_step_sets_done_at_and_expiry(make_store, terminal: TaskState) -> None:
    retention = 5000
    store = make_store(retention=retention)
    for res in put_in_state(store, "t1", S.STARTED):
        assert res.applied
        # non-terminal steps leave no TTL
        assert store.client.ttl(store.keys_of("t1").task("t1")) == -1
    assert "done_at" not in store.get_raw("t1")
    t0 = _ms(store)
    res = store.step("t1", terminal, fence=1)
    t1 = _ms(store)
    assert res.applied
    raw = store.get_raw("t1")
    assert t0 <= int(raw["done_at"]) <= t1
    assert int(raw["done_at"]) == res.now_ms
    assert store.get("t1").completed_at == from_ms(res.now_ms)
    expected = retention + _EXPIRY_SLACK_S
    assert expected - 5 <= store.client.ttl(store.keys_of("t1").task("t1")) <= expected
    assert_indexed_only_in(store, "t1", terminal)
    assert store.client.zscore(store.keys_of("t1").state_index(terminal), "t1") == res.now_ms

    if terminal != S.COMPLETED:  # resubmitting makes the record permanent again
        assert store.step("t1", S.SUBMITTED).applied
        assert store.client.ttl(store.keys_of("t1").task("t1")) == -1
        assert store.get("t1").completed_at is None  # only terminal records have one


def test_index_membership_follows_every_step(make_store) -> None:
    store = make_store()
    path = [
        (S.SUBMITTED, {"create": {"name": NAME, "queue": QUEUE}, "name": NAME}),
        (S.STARTED, {"start": True}),
        (S.SCHEDULED, {"delay_ms": 2500}),
        (S.SUBMITTED, {}),
        (S.SCHEDULED, {"delay_ms": 0}),  # submitted -> scheduled (max_concurrent deferral)
        (S.CANCELLED, {}),
        (S.SUBMITTED, {}),
        (S.STARTED, {"start": True}),
        (S.UNSUBMITTED, {}),
        (S.SUBMITTED, {}),
        (S.STARTED, {"start": True}),
        (S.STALLED, {}),
        (S.SUBMITTED, {}),
        (S.DROPPED, {}),
        (S.SUBMITTED, {}),
        (S.STARTED, {"start": True}),
        (S.FAILED, {}),
        (S.SUBMITTED, {}),
        (S.STARTED, {"start": True}),
        (S.COMPLETED, {}),
    ]
    sub_at = None
    for to, kwargs in path:
        res = store.step("t1", to, **kwargs)
        assert res.applied, (to, res)
        sub_at = sub_at or res.now_ms
        assert_indexed_only_in(store, "t1", to)
        score = store.client.zscore(store.keys_of("t1").state_index(to), "t1")
        raw = store.get_raw("t1")
        if to == S.SCHEDULED:
            run_at = res.now_ms + kwargs["delay_ms"]
            assert score == run_at == int(raw["run_at"])
        else:
            assert score == res.now_ms
            assert "run_at" not in raw
        counts = store.counts()
        assert counts[to] == 1
        assert sum(counts.values()) == 1
        # the all and name indexes keep the first submission time
        for key in (store.keys_of("t1").all_tasks, store.keys_of("t1").name_index(NAME)):
            assert store.client.zscore(key, "t1") == sub_at
    history = store.history("t1")
    assert [t.to_state for t in history] == [to for to, _ in path]
    assert history[0].from_state == S.UNSUBMITTED
    assert all(a.to_state == b.from_state for a, b in itertools.pairwise(history))
    assert store.get("t1").attempt == 5


def test_scheduled_index_is_scored_by_run_at(make_store) -> None:
    store = make_store()
    results = {}
    for task_id, delay in (("late", 30_000), ("soon", 10_000), ("mid", 20_000)):
        put_in_state(store, task_id, S.STARTED)
        results[task_id] = (store.step(task_id, S.SCHEDULED, fence=1, delay_ms=delay), delay)
    for task_id, (res, delay) in results.items():
        run_at = res.now_ms + delay
        assert store.client.zscore(store.keys_of(task_id).state_index(S.SCHEDULED), task_id) == run_at
        assert store.get(task_id).run_at == from_ms(run_at)
    assert [r.task_id for r in store.scheduled()] == ["soon", "mid", "late"]
    assert [r.task_id for r in store.scheduled(limit=2)] == ["soon", "mid"]
    ids, next_ms = store.due()
    assert ids == []
    assert next_ms == results["soon"][0].now_ms + 10_000
    assert store.step("mid", S.CANCELLED).applied
    assert store.get("mid").run_at is None
    assert [r.task_id for r in store.scheduled()] == ["soon", "late"]


# --------------------------------------------------------------------------- reads


def test_get_and_history(make_store) -> None:
    store = make_store()
    assert store.get("nope") is None
    assert store.history("nope") == []
    sub = create(store, "t1", ver="3")
    start = store.step("t1", S.STARTED, start=True, worker="w1@host")
    store.step("t1", S.STARTED, fence=1, set_fields={"progress": '{"done": 4}', "ckpt": "4"},
               sources=(S.SUBMITTED,))  # refused: not part of the history
    fail = store.step("t1", S.FAILED, fence=1, reason="boom",
                      set_fields={"err": '{"type": "builtins.ValueError", "message": "x"}',
                                  "progress": '{"done": 4}', "ckpt": "4"})
    record = store.get("t1")
    assert record.task_id == "t1"
    assert (record.name, record.version, record.queue) == (NAME, 3, QUEUE)
    assert record.state == S.FAILED
    assert (record.attempt, record.retry_attempt) == (1, 0)
    assert record.submitted_at == from_ms(sub.now_ms)
    assert record.started_at == from_ms(start.now_ms)
    assert record.completed_at == from_ms(fail.now_ms)
    assert record.retried_at is None
    assert record.run_at is None
    assert record.worker == "w1@host"
    assert (record.error.type, record.error.message) == ("builtins.ValueError", "x")
    assert record.progress == {"done": 4}
    assert record.checkpoint == 4
    assert record.submitted_at.tzinfo is not None

    history = store.history("t1")
    assert [(t.from_state, t.to_state, t.attempt, t.worker, t.reason) for t in history] == [
        (S.UNSUBMITTED, S.SUBMITTED, 0, None, "published"),
        (S.SUBMITTED, S.STARTED, 1, "w1@host", None),
        (S.STARTED, S.FAILED, 1, None, "boom"),
    ]
    assert [t.at for t in history] == [from_ms(r.now_ms) for r in (sub, start, fail)]
    assert all(t.task_id == "t1" for t in history)


def _build_catalogue(store) -> list[tuple[str, str, str, TaskState]]:
    """Tasks with distinct Redis times, oldest first: (id, name, queue, state)."""
    spec = [
        ("a", "q1", S.SUBMITTED), ("b", "q1", S.STARTED), ("a", "q2", S.COMPLETED),
        ("b", "q2", S.SUBMITTED), ("a", "q1", S.STARTED), ("a", "q1", S.COMPLETED),
        ("b", "q1", S.FAILED), ("a", "q2", S.SUBMITTED), ("b", "q2", S.STARTED),
        ("a", "q1", S.SUBMITTED), ("b", "q1", S.COMPLETED), ("a", "q2", S.FAILED),
    ]
    out = []
    last = 0
    for i, (name, queue, state) in enumerate(spec):
        _next_ms(store, last)
        task_id = f"task-{i:02d}"
        results = put_in_state(store, task_id, state, name=name, queue=queue)
        last = results[-1].now_ms
        out.append((task_id, name, queue, state))
    return out


def test_tasks_filters_newest_first(make_store) -> None:
    store = make_store()
    catalogue = _build_catalogue(store)
    newest_first = list(reversed(catalogue))

    def expect(state=None, name=None, queue=None, limit=100):
        return [t for t, n, q, s in newest_first
                if (state is None or s == state) and (name is None or n == name)
                and (queue is None or q == queue)][:limit]

    def got(**kw):
        return [r.task_id for r in store.tasks(**kw)]

    assert got() == expect()
    assert len(got()) == 12
    for state in TaskState:
        assert got(state=state) == expect(state=state), state
    for name in ("a", "b", "nope"):
        assert got(name=name) == expect(name=name)
    for queue in ("q1", "q2", "nope"):
        assert got(queue=queue) == expect(queue=queue)
    for state, name, queue in itertools.product(
            (None, S.SUBMITTED, S.STARTED, S.COMPLETED, S.FAILED), ("a", "b", None),
            ("q1", "q2", None)):
        assert got(state=state, name=name, queue=queue) == expect(state, name, queue), (
            state, name, queue)
    for limit in (1, 3, 11, 12, 50):
        assert got(limit=limit) == expect(limit=limit)
        assert got(name="a", queue="q1", limit=limit) == expect(name="a", queue="q1",
                                                                limit=limit)
    assert got(state=S.SUBMITTED, limit=2) == expect(state=S.SUBMITTED, limit=2)
    assert got(limit=0) == []
    records = store.tasks()
    assert all(x.submitted_at >= y.submitted_at for x, y in itertools.pairwise(records))

    counts = store.counts()
    assert counts == {s: sum(1 for *_, st in catalogue if st == s) for s in TaskState}
    assert set(counts) == set(TaskState)


def test_reads_skip_and_unindex_records_deleted_behind_the_index(make_store) -> None:
    store = make_store()
    catalogue = _build_catalogue(store)
    gone = {"task-03", "task-07", "task-09"}  # submitted ones
    store.client.delete(*(store.keys_of(t).task(t) for t in gone))

    result = [r.task_id for r in store.tasks(state=S.SUBMITTED)]
    assert result == [t for t, *_, s in reversed(catalogue) if s == S.SUBMITTED and t not in gone]
    for task_id in gone:
        assert store.get(task_id) is None
        assert store.client.zscore(store.keys_of(task_id).state_index(S.SUBMITTED),
                                  task_id) is None  # lazily removed
        assert store.client.zscore(store.keys_of(task_id).all_tasks,
                                  task_id) is not None  # not walked yet
    ids = [r.task_id for r in store.tasks()]
    assert ids == [t for t, *_ in reversed(catalogue) if t not in gone]
    assert not gone & {i for k in store.shards.keys for i in store.client.zrange(k.all_tasks, 0, -1)}
    assert store.counts()[S.SUBMITTED] == 1

    # the scheduled listing does the same
    for i in range(3):
        put_in_state(store, f"sched-{i}", S.SCHEDULED)
    store.client.delete(store.keys_of("sched-1").task("sched-1"))
    assert [r.task_id for r in store.scheduled()] == ["sched-0", "sched-2"]
    assert store.client.zscore(store.keys_of("sched-1").state_index(S.SCHEDULED), "sched-1") is None


def test_tasks_pages_past_deleted_records_without_skipping_live_ones(make_store) -> None:
    store = make_store()
    for i in range(150):
        create(store, f"t{i:03d}")
    order = [r.task_id for r in store.tasks(limit=150)]  # newest first
    gone = set(order[0:100:5])  # 20 among the first page
    store.client.delete(*(store.keys_of(t).task(t) for t in gone))
    live = [t for t in order if t not in gone]
    assert [r.task_id for r in store.tasks(limit=100)] == live[:100]
    assert [r.task_id for r in store.tasks(limit=200)] == live


def test_prune_removes_only_old_terminal_records(make_store) -> None:
    store = make_store(retention=1)
    old = {state: f"old-{state.value}" for state in TERMINAL}
    for state, task_id in old.items():
        put_in_state(store, task_id, state, name="old.task", queue="oldq")
    pending = {state: f"pending-{state.value}"
               for state in (S.SUBMITTED, S.STARTED, S.SCHEDULED, S.UNSUBMITTED)}
    for state, task_id in pending.items():
        put_in_state(store, task_id, state, name="old.task", queue="oldq")
    put_in_state(store, "resubmitted", S.FAILED, name="old.task", queue="oldq")
    assert store.step("resubmitted", S.SUBMITTED).applied
    last_done = max(int(store.get_raw(t)["done_at"]) for t in old.values())
    assert store.prune() == 0  # nothing is older than a second yet

    wait_for(lambda: _ms(store) > last_done + 1000, timeout=5,
             message="the old records to pass the 1 s retention")
    put_in_state(store, "fresh", S.COMPLETED, name="old.task", queue="oldq")

    assert store.prune() == len(old)
    for task_id in old.values():
        k = store.keys_of(task_id)
        assert not store.client.exists(k.task(task_id))
        assert indexed_states(store, task_id) == set()
        for key in (k.all_tasks, k.name_index("old.task")):
            assert store.client.zscore(key, task_id) is None, (key, task_id)
    survivors = [*pending.values(), "resubmitted", "fresh"]
    for task_id in survivors:
        record = store.get(task_id)
        assert record is not None
        assert indexed_states(store, task_id) == {record.state}
        k = store.keys_of(task_id)
        for key in (k.all_tasks, k.name_index("old.task")):
            assert store.client.zscore(key, task_id) is not None
    assert sorted(r.task_id for r in store.tasks(name="old.task")) == sorted(survivors)
    assert sum(store.client.zcard(k.all_tasks) for k in store.shards.keys) == len(survivors)
    assert store.prune() == 0
    counts = store.counts()
    assert sum(counts[s] for s in TERMINAL) == 1
    assert counts[S.COMPLETED] == 1
    assert store.get("fresh").state == S.COMPLETED


# ----------------------------------------------------------------------------- result write
def test_step_with_result_write_writes_only_when_applied(make_store) -> None:
    from jobbers_celery.store import ResultWrite

    store = make_store()
    c = store.client
    put_in_state(store, "t1", S.STARTED)
    pubsub = c.pubsub()
    pubsub.subscribe("meta:t1")
    wait_for(lambda: pubsub.get_message(timeout=0.1), message="the subscription")
    write = ResultWrite(key="meta:t1", value='{"status": "SUCCESS", "result": 1}', expires=60)

    stale = store.step("t1", S.COMPLETED, sources=(S.STARTED,), fence=7, write_result=write)
    assert not stale.applied
    assert stale.why == "stale_attempt"
    assert c.exists("meta:t1") == 0
    before = snapshot(store, "t1")

    done = store.step("t1", S.COMPLETED, sources=(S.STARTED,), fence=1, write_result=write)
    assert done.applied
    assert c.hget(store.keys_of("t1").task("t1"), "state") == S.COMPLETED
    assert c.get("meta:t1") == write.value
    assert 0 < c.ttl("meta:t1") <= 60
    message = wait_for(lambda: pubsub.get_message(timeout=0.1), message="the publish")
    assert message["data"] == write.value
    assert snapshot(store, "t1") != before
    pubsub.close()


def test_result_write_keeps_a_stored_success_and_replaces_anything_else(make_store) -> None:
    from jobbers_celery.store import ResultWrite

    store = make_store()
    c = store.client
    for task_id, stored, kept in [("a", '{"status": "SUCCESS", "result": 0}', True),
                                  ("b", '{"status": "STARTED", "result": null}', False),
                                  ("c", "not json", False)]:
        put_in_state(store, task_id, S.STARTED)
        c.set(f"meta:{task_id}", stored)
        write = ResultWrite(key=f"meta:{task_id}", value='{"status": "SUCCESS"}', expires=0)
        assert store.step(task_id, S.COMPLETED, sources=(S.STARTED,), fence=1,
                          write_result=write).applied
        assert c.get(f"meta:{task_id}") == (stored if kept else write.value)
        assert c.ttl(f"meta:{task_id}") == -1  # expires=0: no expiry


def test_a_step_with_a_result_write_cannot_create_the_record(make_store) -> None:
    from jobbers_celery.store import ResultWrite

    store = make_store()
    with pytest.raises(ValueError, match="cannot create"):
        store.step("x", S.SUBMITTED, create={"name": NAME}, name=NAME,
                   write_result=ResultWrite(key="k", value="v", expires=0))


def test_history_workers_survive_a_start_by_another_worker(make_store) -> None:
    # Entries say "*" for the record's current worker; a start elsewhere spells the old one
    # out first, so every entry still names the worker it happened on.
    store = make_store()
    long_a = "celery@ip-172-31-10-110.eu-west-1.compute.internal"  # 50 characters
    put_in_state(store, "t1", S.SUBMITTED)
    assert store.step("t1", S.STARTED, start=True, worker=long_a).applied
    assert store.step("t1", S.SCHEDULED, fence=1, worker=long_a, delay_ms=0).applied
    assert store.step("t1", S.SUBMITTED, worker="scheduler@b").applied
    assert store.step("t1", S.STARTED, start=True, worker="w@b").applied
    assert store.step("t1", S.COMPLETED, fence=2, worker="w@b", delete=("msg",)).applied
    assert [(t.to_state, t.worker) for t in store.history("t1")] == [
        (S.SUBMITTED, None), (S.STARTED, long_a), (S.SCHEDULED, long_a),
        (S.SUBMITTED, "scheduler@b"), (S.STARTED, "w@b"), (S.COMPLETED, "w@b"),
    ]
    assert store.get("t1").worker == "w@b"
    raw = store.get_raw("t1")
    assert raw["h6"].split("|")[3] == "*"  # the current worker is not repeated


def test_completed_record_is_a_compact_hash_even_with_a_long_hostname(make_store) -> None:
    store = make_store()
    worker = "celery@ip-172-31-10-110.eu-west-1.compute.internal"
    put_in_state(store, "t1", S.SUBMITTED)
    store.client.hset(store.keys_of("t1").task("t1"), "msg", "x" * 400)  # a payload makes it large
    assert store.client.object("encoding", store.keys_of("t1").task("t1")) == "hashtable"
    assert store.step("t1", S.STARTED, start=True, worker=worker).applied
    assert store.step("t1", S.COMPLETED, fence=1, worker=worker, delete=("msg",)).applied
    assert store.client.object("encoding", store.keys_of("t1").task("t1")) == "listpack"
    assert [t.worker for t in store.history("t1")][1:] == [worker, worker]


# --------------------------------------------------------------------------- lean steps


def test_returned_fields_are_the_values_after_the_step(make_store) -> None:
    """``ret`` is read with the state, before the step writes: what the step wrote or
    deleted must still be what it returns."""
    store = make_store()
    put_in_state(store, "t1", S.STARTED)
    store.client.hset(store.keys_of("t1").task("t1"), mapping={"ckpt": '"old"', "progress": "7"})
    res = store.step("t1", S.FAILED, fence=1, set_fields={"ckpt": '"new"', "err": "{}"},
                     delete=("progress",), ret=("ckpt", "progress", "queue", "err", "nope"))
    assert res.applied
    assert res.values == {"ckpt": '"new"', "progress": "", "queue": QUEUE, "err": "{}",
                          "nope": ""}
    refused = store.step("t1", S.COMPLETED, fence=1, ret=("ckpt",))
    assert not refused.applied
    assert refused.values == {}


def test_a_worker_incarnation_enters_the_workers_set_with_its_first_start_here(make_store):
    """Its liveness thread keeps it there afterwards: later starts in the same process do
    not write it again."""
    store = make_store()
    # three ids in one shard (each shard has its copy of the set, entered at the first
    # start there), and one in another
    same = [f"t{i}" for i in range(200) if store.shards.index(f"t{i}") == 0][:3]
    other = next(f"o{i}" for i in range(200) if store.shards.index(f"o{i}") != 0)
    assert len(same) == 3
    assert store.shards.count > 1
    t1, t2, t3 = same
    workers = store.keys_of(t1).workers
    for task_id in (*same, other):
        create(store, task_id)
    assert store.step(t1, S.STARTED, start=True, worker="w@h", wid="wid-1").applied
    assert store.client.zscore(workers, "wid-1") is not None
    store.client.zrem(workers, "wid-1")
    assert store.step(t2, S.STARTED, start=True, worker="w@h", wid="wid-1").applied
    assert store.client.zscore(workers, "wid-1") is None  # once per process (and shard)
    assert store.step(other, S.STARTED, start=True, worker="w@h", wid="wid-1").applied
    assert store.client.zscore(store.keys_of(other).workers, "wid-1") is not None
    assert store.step(t3, S.STARTED, start=True, worker="w@h", wid="wid-2").applied
    assert store.client.zscore(workers, "wid-2") is not None  # another incarnation


@pytest.mark.parametrize("shards", [1, 16])
def test_an_ending_attempt_releases_its_lease_and_heartbeat_deadline(make_store,
                                                                     shards: int) -> None:
    """One shard: the lease is taken and released inside the steps; several: taken in the
    global slot before the start step, released after the end step (conc.lua)."""
    store = make_store(shards=shards)
    k = store.keys
    create(store, "capped")
    create(store, "plain")
    capped = store.step("capped", S.STARTED, start=True, worker="w@h", wid="wid-1", cap=5,
                        heartbeat_ms=60_000, name=NAME)
    assert capped.applied
    assert capped.state is S.STARTED
    assert store.get_raw("capped")["cap"] == "5"
    assert store.client.zscore(k.concurrency(NAME), "capped") is not None
    assert store.client.zscore(store.keys_of("capped").heartbeat_due, "capped") is not None
    assert store.step("plain", S.STARTED, start=True, worker="w@h", wid="wid-1",
                      name=NAME).applied
    assert "cap" not in store.get_raw("plain")
    for task_id in ("capped", "plain"):
        assert store.step(task_id, S.COMPLETED, fence=1, wid="wid-1", name=NAME,
                          delete=("hb_iv",)).applied
    assert store.client.zscore(k.concurrency(NAME), "capped") is None
    assert store.client.zscore(store.keys_of("capped").heartbeat_due, "capped") is None
    assert sum(store.client.zcard(s.worker_tasks("wid-1")) for s in store.shards.keys) == 0
    assert "cap" not in store.get_raw("capped")


@pytest.mark.parametrize("shards", [1, 16])
def test_the_cap_defers_the_start_past_it_and_frees_the_slot_of_an_ended_attempt(
        make_store, shards: int) -> None:
    """Over the cap a start is deferred (scheduled, no retry used) and holds no lease; a
    lease is renewed by the worker's liveness refresh (and, with one shard, a heartbeat);
    a stalled attempt's lease is released by the cleaner's verdict."""
    store = make_store(shards=shards)
    conc = store.keys.concurrency(NAME)
    for task_id in ("a", "b", "c"):
        create(store, task_id)
    for task_id in ("a", "b"):
        res = store.step(task_id, S.STARTED, start=True, worker="w@h", wid="wid-1", cap=2,
                         name=NAME, lease_cap_ms=5_000)
        assert res.state is S.STARTED
    over = store.step("c", S.STARTED, start=True, worker="w@h", wid="wid-1", cap=2,
                      name=NAME, lease_cap_ms=5_000, defer_ms=60_000)
    assert over.applied
    assert over.state is S.SCHEDULED
    assert "max_concurrent=2 reached" in (store.history("c")[-1].reason or "")
    assert set(store.client.zrange(conc, 0, -1)) == {"a", "b"}
    before = store.client.zscore(conc, "a")
    gap = (3000, 30000)
    store.alive("wid-1", gap, [(NAME, "a"), (NAME, "b")], 600_000, running=["a", "b"],
                orphan_ms=60_000)
    assert store.client.zscore(conc, "a") > before + 500_000  # renewed
    # the cleaner ends b's attempt: its slot is free again, and c starts when due
    verdict = store.stall([("b", "gone", "wid-1", NAME)], 60_000, 30_000)
    assert verdict.stalled == 1
    assert set(store.client.zrange(conc, 0, -1)) == {"a"}
    store.client.hset(store.keys_of("c").task("c"), "run_at", 0)  # due now
    assert [c.task_id for c in store.claim(["c"], 30_000, "s1")] == ["c"]
    res = store.step("c", S.STARTED, start=True, worker="w@h", wid="wid-1", cap=2,
                     name=NAME, lease_cap_ms=5_000)
    assert res.state is S.STARTED
    assert set(store.client.zrange(conc, 0, -1)) == {"a", "c"}


@pytest.mark.parametrize("shards", [1, 16])
def test_another_delivery_of_a_running_capped_task_leaves_its_lease(make_store,
                                                                    shards: int) -> None:
    """A redelivered message of a task that runs is refused at its start; the running
    attempt keeps its slot, so the cap still holds others back."""
    store = make_store(shards=shards)
    conc = store.keys.concurrency(NAME)
    for task_id in ("a", "b"):
        create(store, task_id)
    kwargs = {"start": True, "worker": "w@h", "wid": "wid-1", "cap": 1, "name": NAME}
    assert store.step("a", S.STARTED, **kwargs).state is S.STARTED
    again = store.step("a", S.STARTED, expect_refusal=True, **kwargs)
    assert not again.applied
    assert store.client.zrange(conc, 0, -1) == ["a"]
    assert store.step("b", S.STARTED, **kwargs).state is S.SCHEDULED  # deferred
    assert store.client.zrange(conc, 0, -1) == ["a"]
