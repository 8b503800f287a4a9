"""Concurrent clients on one Redis: compare-and-set steps and scheduler claims never double up.

Every racer has its own RedisStore (its own connection pool) and runs in its own thread;
a barrier releases them together so their calls interleave on the server.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from jobbers_celery.core.states import TERMINAL, TaskState
from jobbers_celery.lifecycle.scheduler import Scheduler
from jobbers_celery.store import Claimed, RedisStore, StepResult
from tests.conftest import wait_for
from tests.integration.store_helpers import (
    create,
    put_in_state,
)

pytestmark = pytest.mark.redis


S = TaskState


def _race(*workers: Callable[[threading.Barrier], Any], timeout: float = 30.0) -> list[Any]:
    """Run the callables in threads released together; return their results in order.

    Each callable gets the shared barrier, so it can also line up with the others before
    every single operation (see :func:`_lockstep`).
    """
    barrier = threading.Barrier(len(workers))
    results: list[Any] = [None] * len(workers)
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[threading.Barrier], Any]) -> None:
        try:
            barrier.wait(timeout)
            results[i] = fn(barrier)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True)
               for i, fn in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "racer did not finish"
    if errors:
        raise errors[0]
    return results


def _lockstep(ids: list[str], op: Callable[[str], StepResult]
              ) -> Callable[[threading.Barrier], list[StepResult]]:
    """Apply ``op`` to every id, meeting the other racers at the barrier before each one,
    so that both clients send their step for the same task at the same moment (otherwise
    whichever thread is a little ahead simply wins every task)."""
    def run(barrier: threading.Barrier) -> list[StepResult]:
        out = []
        for task_id in ids:
            barrier.wait(10)
            out.append(op(task_id))
        return out
    return run


def _bulk_create(store: RedisStore, ids: list[str], start: bool) -> None:
    for task_id in ids:
        create(store, task_id)
        if start:
            assert store.step(task_id, S.STARTED, start=True, worker="w0").applied


def test_conflicting_terminal_steps_one_winner_per_task(make_store) -> None:
    setup, alpha, beta = make_store(), make_store(), make_store()
    ids = [f"race-{i:04d}" for i in range(1000)]
    _bulk_create(setup, ids, start=True)

    def finish(store: RedisStore, to: TaskState) -> Callable[[threading.Barrier], Any]:
        return _lockstep(ids, lambda t: store.step(t, to, fence=1, worker=f"{to}"))

    completed, failed = _race(finish(alpha, S.COMPLETED), finish(beta, S.FAILED))

    wins = collections.Counter()
    for task_id, a, b in zip(ids, completed, failed, strict=True):
        assert a.applied != b.applied, (task_id, a, b)
        winner, loser = (a, b) if a.applied else (b, a)
        won_state = S.COMPLETED if a.applied else S.FAILED
        wins[won_state] += 1
        assert winner.previous == "started"
        assert winner.attempt == 1
        assert loser.why == "state"
        assert loser.previous == won_state.value
        record = setup.get(task_id)
        assert record.state == won_state
        history = setup.history(task_id)
        assert [t.to_state for t in history] == [S.SUBMITTED, S.STARTED, won_state]
        assert sum(t.to_state in TERMINAL for t in history) == 1
        assert record.completed_at is not None
    assert sum(wins.values()) == len(ids)
    # lockstep makes it a real race: each side wins a share (about half), not all
    assert wins[S.COMPLETED] > 0, wins
    assert wins[S.FAILED] > 0, wins
    counts = setup.counts()
    assert counts[S.COMPLETED] == wins[S.COMPLETED]
    assert counts[S.FAILED] == wins[S.FAILED]
    assert counts[S.STARTED] == 0
    refused = setup.refused_counts()
    assert refused["refused"] == len(ids)
    assert (refused.get("refused:completed>failed", 0)
            + refused.get("refused:failed>completed", 0)) == len(ids)


def test_racing_starts_start_each_task_exactly_once(make_store) -> None:
    setup, alpha, beta = make_store(), make_store(), make_store()
    ids = [f"start-{i:04d}" for i in range(1000)]
    _bulk_create(setup, ids, start=False)

    def start(store: RedisStore, worker: str) -> Callable[[threading.Barrier], Any]:
        return _lockstep(ids, lambda t: store.step(t, S.STARTED, start=True, worker=worker))

    by_a, by_b = _race(start(alpha, "a@host"), start(beta, "b@host"))

    for task_id, a, b in zip(ids, by_a, by_b, strict=True):
        assert a.applied != b.applied, (task_id, a, b)
        winner = a if a.applied else b
        loser = b if a.applied else a
        assert winner.attempt == 1
        assert loser.why == "state"
        record = setup.get(task_id)
        assert record.state == S.STARTED
        assert record.attempt == 1
        assert record.worker == ("a@host" if a.applied else "b@host")
        assert record.retried_at is None
        history = setup.history(task_id)
        assert [t.to_state for t in history] == [S.SUBMITTED, S.STARTED]
    assert setup.counts()[S.STARTED] == len(ids)
    assert 0 < sum(a.applied for a in by_a) < len(ids), "one client won every start: no race"
    assert setup.refused_counts()["refused:started>started"] == len(ids)


def _schedule(store: RedisStore, ids: list[str], delay_ms: Callable[[int], int]) -> None:
    for i, task_id in enumerate(ids):
        create(store, task_id)
        res = store.step(task_id, S.SCHEDULED, delay_ms=delay_ms(i))  # submitted -> scheduled
        assert res.applied


def test_two_schedulers_claim_every_due_task_exactly_once(make_store) -> None:
    setup = make_store()
    ids = [f"due-{i:03d}" for i in range(500)]
    # due times spread over ~0.3 s after setup, so the schedulers meet on a trickle
    _schedule(setup, ids, lambda i: 200 + (i * 7) % 300)

    def scheduler(store: RedisStore, name: str, batch: int
                  ) -> Callable[[threading.Barrier], list[str]]:
        def loop(_: threading.Barrier) -> list[str]:
            claimed: list[str] = []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                due, next_ms = store.due(batch)
                if due:
                    got = store.claim(due, lease_ms=60_000, worker=name)
                    claimed += [c.task_id for c in got]
                    store.confirm_published([c.task_id for c in got])
                elif next_ms is None:  # nothing scheduled, nothing leased out and expired
                    return claimed
            raise AssertionError(f"{name} still found due work after 20 s")
        return loop

    first, second = _race(scheduler(make_store(), "s1", 50),
                          scheduler(make_store(), "s2", 37))

    assert len(first) + len(second) == len(ids)
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(ids)
    assert first, "both schedulers should have taken part"
    assert second, "both schedulers should have taken part"
    for task_id in ids:
        history = setup.history(task_id)
        assert [t.to_state for t in history] == [S.SUBMITTED, S.SCHEDULED, S.SUBMITTED]
        assert history[-1].worker == ("s1" if task_id in set(first) else "s2")
        assert setup.get(task_id).run_at is None
    counts = setup.counts()
    assert counts[S.SUBMITTED] == len(ids)
    assert counts[S.SCHEDULED] == 0
    assert sum(setup.client.zcard(k.publishing) for k in setup.shards.keys) == 0
    assert setup.due() == ([], None)
    assert "republished" not in setup.refused_counts()


class _RecordingScheduler(Scheduler):
    """The real run_once/claim/confirm path; publishing only records the claim."""

    published: list[str]

    def _publish(self, item: Claimed, now_ms: int) -> None:
        self.published.append(item.task_id)


def test_two_scheduler_run_once_loops_publish_each_task_once(make_store) -> None:
    setup = make_store()
    ids = [f"sched-{i:03d}" for i in range(300)]
    _schedule(setup, ids, lambda i: 100 + (i * 13) % 200)

    def runner(name: str) -> Callable[[threading.Barrier], list[str]]:
        jobbers = SimpleNamespace(store=make_store(), config=SimpleNamespace(publish_lease=60))
        sched = _RecordingScheduler(jobbers.store, jobbers.config,  # type: ignore[arg-type]
                                    None, worker_name=name)
        sched.published = []

        def loop(_: threading.Barrier) -> list[str]:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                _, wait = sched.run_once()
                if wait is None and not jobbers.store.due()[0]:
                    return sched.published
            raise AssertionError(f"{name} did not drain the schedule")
        return loop

    first, second = _race(runner("w1"), runner("w2"))
    assert sorted(first + second) == sorted(ids)
    assert len(set(first + second)) == len(ids)
    assert sum(setup.client.zcard(k.publishing) for k in setup.shards.keys) == 0


def test_unconfirmed_claim_is_handed_out_again_after_its_lease(make_store) -> None:
    store, other = make_store(), make_store()
    lease_ms = 500
    create(store, "t1", name="proj.slow")
    store.client.hset(store.keys_of("t1").task("t1"), "retries", "2")
    assert store.step("t1", S.SCHEDULED, delay_ms=0).applied
    wait_for(lambda: store.due()[0] == ["t1"], message="t1 to be due")

    before = store.now_ms()
    claimed = store.claim(["t1"], lease_ms, "w1")
    after = store.now_ms()
    assert [(c.task_id, c.name, c.retries) for c in claimed] == [("t1", "proj.slow", 2)]
    assert '"args": [1, 2]' in claimed[0].msg
    deadline = store.client.zscore(store.keys_of("t1").publishing, "t1")
    assert before + lease_ms <= deadline <= after + lease_ms
    assert store.get("t1").state == S.SUBMITTED

    # within the lease nobody gets it again ...
    assert other.due()[0] == []
    assert other.claim(["t1"], lease_ms, "w2") == []
    assert store.now_ms() < deadline, "lease too short for this check; raise lease_ms"

    # ... and once it has expired, the next due() returns it (never earlier)
    def handed_out_again() -> bool:
        t0 = store.now_ms()
        due, _ = other.due()
        t1 = store.now_ms()
        if due:
            assert due == ["t1"]
            assert t1 >= deadline, "handed out again before its lease expired"
            return True
        assert t0 < deadline, "lease expired but due() did not return the task"
        return False

    wait_for(handed_out_again, timeout=5, interval=0.01, message="the lease to expire")
    again = other.claim(["t1"], lease_ms, "w2")
    assert [(c.task_id, c.name, c.retries) for c in again] == [("t1", "proj.slow", 2)]
    assert again[0].msg == claimed[0].msg
    assert store.refused_counts()["republished"] == 1
    # republishing is no transition: the record and its history are unchanged
    assert [t.to_state for t in store.history("t1")] == [S.SUBMITTED, S.SCHEDULED, S.SUBMITTED]
    assert store.get("t1").state == S.SUBMITTED
    assert store.client.zscore(store.keys_of("t1").publishing, "t1") > deadline  # a fresh lease

    other.confirm_published(["t1"])
    assert store.client.zscore(store.keys_of("t1").publishing, "t1") is None
    assert store.due() == ([], None)
    assert store.claim(["t1"], lease_ms, "w3") == []


def test_expired_lease_of_a_task_that_started_meanwhile_is_dropped(make_store) -> None:
    store = make_store()
    create(store, "t1")
    assert store.step("t1", S.SCHEDULED, delay_ms=0).applied
    wait_for(lambda: store.due()[0] == ["t1"], message="t1 to be due")
    assert len(store.claim(["t1"], 100, "w1")) == 1
    # the message reached a worker although the publisher never confirmed
    assert store.step("t1", S.STARTED, start=True).applied
    wait_for(lambda: store.due()[0] == ["t1"], message="the lease to expire")
    assert store.claim(["t1"], 100, "w2") == []
    assert store.client.zscore(store.keys_of("t1").publishing, "t1") is None
    assert store.due() == ([], None)
    assert store.get("t1").state == S.STARTED


def test_fresh_store_instances_see_each_others_steps(make_store) -> None:
    """Sanity for the race tests: separate pools, one server, one namespace."""
    a, b = make_store(), make_store()
    put_in_state(a, "t1", S.STARTED)
    assert b.get("t1").state == S.STARTED
    assert a.client.connection_pool is not b.client.connection_pool
