"""End to end: ``max_concurrent`` holds across workers, and a dead holder's lease frees itself.

``proj.capped`` has ``max_concurrent=2`` and counts in Redis how many of its bodies run at
once (``key:now``, the most seen in ``key:max``).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import ms, unique, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
DEFERRED = (S.SUBMITTED, S.SCHEDULED)


def deferrals(jobbers, task_id: str) -> list[str]:
    """The reasons of the task's deferrals (submitted -> scheduled)."""
    return [t.reason or "" for t in jobbers.history(task_id)
            if (t.from_state, t.to_state) == DEFERRED]


def most_started_at_once(jobbers, task_ids: list[str]) -> int:
    """The most tasks in ``started`` at the same time, by their recorded transitions."""
    events = []
    for task_id in task_ids:
        for t in jobbers.history(task_id):
            if t.to_state == S.STARTED:
                events.append((ms(t.at), 1))
            elif t.from_state == S.STARTED:
                events.append((ms(t.at), -1))
    running = most = 0
    for _, delta in sorted(events):  # at the same ms a release sorts before a start
        running += delta
        most = max(most, running)
    return most


def test_twenty_capped_tasks_on_four_processes_never_exceed_two(proj, worker_factory):
    jobbers = proj.jobbers
    client = jobbers.store.client
    # Prefetch 1: a worker with a local backlog would otherwise re-take each lease its own
    # processes release, and the other worker's deliveries would only ever be deferred.
    workers = [worker_factory(pool="prefork", concurrency=2, extra=["--prefetch-multiplier", "1"])
               for _ in range(2)]
    key = unique("capped")
    started = time.monotonic()
    results = [proj.capped.delay(key, 0.5) for _ in range(20)]
    ids = [r.id for r in results]
    wait_for(lambda: client.llen(f"{key}:done") == 20, timeout=50, interval=0.1,
             message="20 capped tasks to finish")
    took = time.monotonic() - started
    for task_id in ids:
        wait_state(jobbers, task_id, S.COMPLETED, worker=workers[0])
    total_deferrals = sum(len(deferrals(jobbers, i)) for i in ids)
    ran_on = Counter(jobbers.get(i).worker for i in ids)
    print(f"\n20 x proj.capped(0.5 s), max_concurrent=2, 2 workers x 2 processes: all done in "
          f"{took:.1f}s (ideal 5.0s); {total_deferrals} deferrals; max running at once "
          f"{client.get(f'{key}:max')}; ran on {sorted(ran_on.values())}")

    assert int(client.get(f"{key}:max")) == 2
    assert int(client.get(f"{key}:now")) == 0
    assert sorted(client.lrange(f"{key}:done", 0, -1)) == sorted(ids)
    assert most_started_at_once(jobbers, ids) == 2
    for task_id in ids:
        record = jobbers.get(task_id)
        assert record.state == S.COMPLETED
        assert record.attempt == 1  # deferrals are not starts
        assert record.retry_attempt == 0  # ... nor retries
        assert record.error is None
        reasons = deferrals(jobbers, task_id)
        assert all(r == "max_concurrent=2 reached: deferred, no retry used" for r in reasons)
        states = [(t.from_state, t.to_state) for t in jobbers.history(task_id)]
        # each deferral is followed by the scheduler's republish
        assert states.count((S.SCHEDULED, S.SUBMITTED)) == len(reasons)
    assert total_deferrals >= 2  # four processes, a cap of two: some had to wait
    # Every lease was released.
    assert client.zcard(jobbers.store.keys.concurrency("proj.capped")) == 0


def test_a_dead_holder_frees_its_lease(proj, worker_factory):
    jobbers = proj.jobbers
    client = jobbers.store.client
    lost_after = jobbers.config.worker_lost_after
    holder = worker_factory(pool="prefork", concurrency=2)
    held_key = unique("held")
    held = [proj.capped.delay(held_key, 60) for _ in range(2)]
    for result in held:
        wait_state(jobbers, result.id, S.STARTED, worker=holder)
    leases = jobbers.store.keys.concurrency("proj.capped")
    assert set(client.zrange(leases, 0, -1)) == {r.id for r in held}
    other = worker_factory(pool="threads", concurrency=2)

    os.killpg(holder.proc.pid, signal.SIGKILL)  # the whole worker: main process and pool
    holder.proc.wait(10)
    killed_ms = jobbers.store.now_ms()
    key = unique("after")
    waiting = [proj.capped.delay(key, 0.2) for _ in range(2)]
    for result in waiting:
        wait_state(jobbers, result.id, S.COMPLETED, timeout=30, worker=other)
    first_start = min(ms(t.at) for r in waiting for t in jobbers.history(r.id)
                      if t.to_state == S.STARTED)
    waited = (first_start - killed_ms) / 1000
    print(f"\nholder SIGKILLed; the next capped task started {waited:.2f}s later "
          f"(jobbers_worker_lost_after={lost_after:g}s)")
    # The dead holder's leases were renewed until it died and expire lost_after later.
    assert lost_after - 1.0 <= waited < lost_after + 8
    for result in waiting:
        record = jobbers.get(result.id)
        assert record.worker == other.name
        assert (record.attempt, record.retry_attempt) == (1, 0)
        assert deferrals(jobbers, result.id), "started although the dead holder's lease was live"
    assert int(client.get(f"{key}:max")) <= 2

    # The cleaner (the surviving worker's catch-up pass) declares the dead holder's tasks
    # stalled (capped has no stall recoveries).
    for result in held:
        record = wait_state(jobbers, result.id, S.STALLED, timeout=20, worker=other)
        assert "not seen" in jobbers.history(result.id)[-1].reason
        assert record.attempt == 1
    assert client.zcard(leases) == 0
