"""End to end: ``max_concurrent`` per key (``concurrency_key``), real prefork workers.

``fair_proj.work`` runs at most 2 at once per tenant. A large tenant's backlog is parked in
its key's list (no churn, no retry used) while a small tenant's tasks, published after it,
start at once; the cap per key holds across two workers; and the same on the sharded
layout, where the keyed lease is taken in the global slot before the start step; and the
store killed and restarted while a key's tasks are parked: each runs once, one at a time.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from celery import chain, chord, group

from jobbers_celery import TaskState, get_jobbers
from tests.conftest import ROOT, Worker, start_worker, subprocess_env, wait_for
from tests.integration.topology_servers import executions, restartable_redis

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
PARKED = "parked, no retry used"


@pytest.fixture
def fair(redis_url: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
         ) -> Any:
    monkeypatch.setenv("FAIR_SHARDS", str(getattr(request, "param", 1)))
    import tests.integration.fair_proj as module

    return importlib.reload(module)  # the layout of this test's FAIR_SHARDS


@pytest.fixture
def workers(fair: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Worker]]:
    env = {"FAIR_SHARDS": str(getattr(request, "param", 1))}
    started = [start_worker(fair.app, "tests.integration.fair_proj", tmp_path,
                            concurrency=2, env=env,
                            options=["--without-mingle", "--without-gossip",
                                     "--without-heartbeat", "--prefetch-multiplier", "1"])
               for _ in range(2)]
    yield started
    for w in started:
        w.kill()


def _cli(*args: str) -> str:
    """``celery -A tests.integration.fair_proj jobbers ARGS``'s output (exit 0)."""
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.fair_proj", "jobbers", *args],
        cwd=ROOT, env=subprocess_env({"NO_COLOR": "1"}), capture_output=True, text=True,
        timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _parked(jobbers: Any, task_id: str) -> list[str]:
    return [t.reason or "" for t in jobbers.history(task_id)
            if (t.from_state, t.to_state) == (S.SUBMITTED, S.SCHEDULED)]


def test_small_tenant_starts_while_large_tenant_has_hundreds_parked(fair, workers):
    jobbers, client = fair.jobbers, fair.jobbers.store.client
    key = f"fair-{uuid.uuid4().hex[:8]}"
    # 0.2 s each at the key's cap of 2: the big tenant drains at 10 a second, so the counts
    # below (hundreds waiting, >= 150 parked when the CLI, a new process, reads them) hold
    # on a loaded machine too (at 0.05 s, 40 a second, a CLI slow to start read fewer)
    big = [fair.work.delay(key, "big", 0.2).id for _ in range(300)]
    published = time.monotonic()
    small = [fair.work.delay(key, "small", 0.05).id for _ in range(4)]
    wait_for(lambda: all(jobbers.get(i).state is S.COMPLETED for i in small), timeout=30,
             interval=0.05, message="the small tenant's 4 tasks to complete")
    took = time.monotonic() - published
    waits = [(r.started_at - r.submitted_at).total_seconds()
             for r in (jobbers.get(i) for i in small)]
    big_left = sum(1 for i in big if jobbers.get(i).state is not S.COMPLETED)
    held = {h.key: h for h in jobbers.store.fair_held()}
    print(f"\nsmall tenant: 4 done {took:.2f}s after publish, publish-to-start "
          f"{min(waits):.2f}-{max(waits):.2f}s; big tenant: {big_left} of 300 not done; "
          f"held {held}")
    assert big_left >= 200  # the large tenant still has hundreds waiting
    assert max(waits) < 10
    assert [h.name for h in held.values()] == ["fair.work"]
    (big_held,) = held.values()
    shown = json.loads(_cli("fair", "--json"))  # what operators read: celery jobbers fair
    assert [(h["name"], h["key"], h["digest"]) for h in shown] == [
        ("fair.work", big_held.key, big_held.digest)]
    assert shown[0]["parked"] >= 150
    assert big_held.cap == 2
    assert big_held.parked >= 150
    assert int(client.get(f"{key}:big:max")) == 2  # across 2 workers x 2 processes
    assert int(client.get(f"{key}:small:max")) <= 2
    parked = [i for i in big if _parked(jobbers, i)]
    assert len(parked) >= 200
    record = jobbers.get(parked[-1])
    assert record.state is S.SCHEDULED
    assert record.retry_attempt == 0
    assert _parked(jobbers, parked[-1]) == [f"key {big_held.key} at max_concurrent=2: {PARKED}"]
    # no churn: a parked task is not published again until its key has room
    before = {i: len(jobbers.history(i)) for i in parked[-20:]}
    wait_for(lambda: int(client.llen(f"{key}:done")) >= 4 + 10, timeout=20, interval=0.05,
             message="10 more of the big tenant's tasks to run")
    assert all(len(jobbers.history(i)) == n for i, n in before.items()
               if jobbers.get(i).state is S.SCHEDULED)


@pytest.mark.parametrize("fair", [4], indirect=True)
@pytest.mark.parametrize("workers", [4], indirect=True)
def test_sharded_layout_keeps_the_cap_per_key_and_releases_in_order(fair, workers):
    jobbers, client = fair.jobbers, fair.jobbers.store.client
    assert jobbers.store.sharded
    key = f"fair-{uuid.uuid4().hex[:8]}"
    big = [fair.work.delay(key, "big", 0.1).id for _ in range(12)]
    small = fair.work.delay(key, "small", 0.0).id
    wait_for(lambda: int(client.llen(f"{key}:done")) == 13, timeout=40, interval=0.05,
             message="13 tasks to run")
    for task_id in [*big, small]:
        record = jobbers.get(task_id)
        assert (record.state, record.attempt) == (S.COMPLETED, 1), record
    assert int(client.get(f"{key}:big:max")) == 2
    parked = [i for i in big if _parked(jobbers, i)]
    assert parked
    reasons = [t.reason for t in jobbers.history(parked[-1])]
    assert "released: its key has room (fair share)" in reasons
    assert jobbers.store.fair_held() == []


def _queued(client: Any) -> int:
    """Messages waiting at the broker (the default queue; not those a worker pulled)."""
    return int(client.llen("celery"))


@pytest.mark.parametrize(("fair", "workers"), [(1, 1), (4, 4)], indirect=True,
                         ids=["one-shard", "four-shards"])
def test_a_large_tenants_group_is_held_back_at_publish(fair, workers):
    """A large tenant's 300 members published as one group, then a small tenant's task: the
    broker never holds more than the key's cap of the group's messages (the rest are parked
    by the group's publish, not as each is pulled), the small task starts within the page's
    bound, not after the group drains, and every member completes once, its group's result
    too."""
    jobbers, client = fair.jobbers, fair.jobbers.store.client
    key = f"fair-{uuid.uuid4().hex[:8]}"
    n, seconds = (300, 0.02) if not jobbers.store.sharded else (40, 0.02)
    published = time.monotonic()
    big = group(fair.work.s(key, "big", seconds) for _ in range(n)).apply_async()
    queued = [_queued(client)]
    small = fair.work.delay(key, "small", 0.0).id

    def ran(count: int) -> bool:
        queued.append(_queued(client))
        return int(client.llen(f"{key}:done")) >= count

    wait_for(lambda: ran(1) and jobbers.get(small).state is S.COMPLETED, timeout=30,
             interval=0.01, message="the small tenant's task")
    record = jobbers.get(small)
    wait = (record.started_at - record.submitted_at).total_seconds()
    big_left = n - int(client.llen(f"{key}:done")) + 1
    wait_for(lambda: ran(n + 1), timeout=60, interval=0.05, message="every member to run")
    took = time.monotonic() - published
    results = big.get(timeout=30)
    ids = [r.id for r in big.results]
    parked = [i for i in ids if _parked(jobbers, i)]
    print(f"\ngroup of {n}: broker held at most {max(queued)} message(s); small tenant's "
          f"publish-to-start {wait:.3f}s with {big_left} of the group not run; "
          f"{len(parked)} parked; all done in {took:.1f}s")
    assert max(queued) <= 2 + 1  # the key's cap, and the small task's own message
    assert wait < 5
    assert big_left >= n // 2
    assert len(results) == n
    assert len(parked) >= n - 4
    for task_id in ids:
        record = jobbers.get(task_id)
        assert (record.state, record.attempt) == (S.COMPLETED, 1), record
    assert int(client.get(f"{key}:big:max")) == 2
    assert jobbers.store.fair_held() == []


def _parked_at_start(jobbers: Any, task_id: str) -> int:
    """How many times ``task_id`` was parked by a worker's start step (which records its
    worker; a publish's or the scheduler's park records none): its message had reached
    the broker."""
    return sum(1 for t in jobbers.history(task_id)
               if (t.from_state, t.to_state) == (S.SUBMITTED, S.SCHEDULED)
               and PARKED in (t.reason or "") and t.worker)


def _parked_when_due(jobbers: Any, task_id: str) -> bool:
    """Whether the scheduler parked ``task_id`` as it came due (``run_at reached``, then
    parked by that publish's step, no worker)."""
    moves = [(t.reason or "", t.worker) for t in jobbers.history(task_id)]
    return any(reason == "run_at reached" and PARKED in after[0] and not after[1]
               for (reason, _), after in pairwise(moves))


@pytest.mark.parametrize(("fair", "workers"), [(1, 1), (4, 4)], indirect=True,
                         ids=["one-shard", "four-shards"])
def test_a_large_tenants_countdown_backlog_is_parked_when_it_comes_due(fair, workers):
    """A large tenant's backlog published with a countdown (it waits in the store), all
    coming due at once: the scheduler's publish of each parks it when its key has no room,
    so the broker never holds more than the key's cap of them, none is parked at its start
    (none reached the broker to be), and a small tenant's task published once they are due
    starts within the page's bound, ``(K x max_concurrent / S + 1) x T``. Each is decided
    once, by the scheduler holding the lease, though two or four workers' schedulers read
    it due."""
    jobbers, client = fair.jobbers, fair.jobbers.store.client
    key = f"fair-{uuid.uuid4().hex[:8]}"
    n, seconds = (200, 0.05) if not jobbers.store.sharded else (60, 0.05)
    big = [fair.work.apply_async((key, "big", seconds), countdown=1.0).id for _ in range(n)]
    queued = [_queued(client)]

    def due_parked() -> int:
        queued.append(_queued(client))
        return sum(1 for i in big if _parked_when_due(jobbers, i))

    wait_for(lambda: due_parked() >= n // 2, timeout=30, interval=0.02,
             message="the big tenant's due tasks to be parked by the scheduler")
    small = fair.work.delay(key, "small", 0.0).id
    wait_for(lambda: queued.append(_queued(client)) or
             jobbers.get(small).state is S.COMPLETED, timeout=30, interval=0.01,
             message="the small tenant's task")
    record = jobbers.get(small)
    wait = (record.started_at - record.submitted_at).total_seconds()
    big_left = n - int(client.llen(f"{key}:done")) + 1
    wait_for(lambda: queued.append(_queued(client)) or
             int(client.llen(f"{key}:done")) >= n + 1, timeout=90, interval=0.05,
             message="every task of the backlog to run")
    at_start = sum(_parked_at_start(jobbers, i) for i in big)
    parked = sum(1 for i in big if _parked_when_due(jobbers, i))
    # K = 2 keys, cap 2, S = 4 processes, T = the task's time plus 1 s of allowance for its
    # overhead on a loaded test machine
    bound = (2 * 2 / 4 + 1) * (seconds + 1.0)
    print(f"\ncountdown backlog of {n}: broker held at most {max(queued)} message(s); "
          f"{parked} parked when due, {at_start} at their start; small tenant's "
          f"publish-to-start {wait:.3f}s (bound {bound:.2f}s) with {big_left} not run")
    assert max(queued) <= 2 + 1  # the key's cap, and the small task's own message
    assert at_start == 0
    assert parked >= n - 4
    decided = [sum(1 for t in jobbers.history(i) if t.reason == "run_at reached") for i in big]
    assert decided == [1] * n  # one scheduler decides (the lease): never twice
    assert wait <= bound
    assert big_left >= n // 4
    for task_id in big:
        record = jobbers.get(task_id)
        assert (record.state, record.attempt) == (S.COMPLETED, 1), record
    assert int(client.get(f"{key}:big:max")) == 2
    assert jobbers.store.fair_held() == []


@pytest.mark.parametrize(("fair", "workers"), [(1, 1)], indirect=True, ids=["one-shard"])
def test_a_large_tenants_chains_are_parked_link_by_link(fair, workers):
    """A large tenant's 60 chains of 3 links published at once, then a small tenant's task:
    each first link past the key's room is parked by the chain's publish, each next link by
    the worker's publish as the link before it ends, none at its start; the broker never
    holds more than the key's cap of them; the small task starts within the bound; every
    chain runs all its links (the parked links carried the rest of their chain)."""
    jobbers, client = fair.jobbers, fair.jobbers.store.client
    key = f"fair-{uuid.uuid4().hex[:8]}"
    n, seconds = 60, 0.02
    chains = [chain(fair.link.s(0, key, "big", seconds),
                    fair.link.s(key=key, tenant="big", seconds=seconds),
                    fair.link.s(key=key, tenant="big", seconds=seconds)).apply_async()
              for _ in range(n)]
    queued = [_queued(client)]
    small = fair.work.delay(key, "small", 0.0).id
    wait_for(lambda: queued.append(_queued(client)) or
             jobbers.get(small).state is S.COMPLETED, timeout=30, interval=0.01,
             message="the small tenant's task")
    record = jobbers.get(small)
    wait = (record.started_at - record.submitted_at).total_seconds()
    assert [c.get(timeout=120) for c in chains] == [3] * n
    links = []
    for last in chains:
        node = last
        while node is not None:
            links.append(node.id)
            node = node.parent
    at_start = sum(_parked_at_start(jobbers, i) for i in links)
    parked = sum(1 for i in links if any(
        PARKED in (t.reason or "") and not t.worker for t in jobbers.history(i)))
    bound = (2 * 2 / 4 + 1) * (seconds + 1.0)
    print(f"\n{n} chains of 3: broker held at most {max(queued)} message(s); {parked} of "
          f"{len(links)} links parked at their publish, {at_start} at their start; small "
          f"tenant's publish-to-start {wait:.3f}s (bound {bound:.2f}s)")
    assert len(links) == 3 * n
    assert max(queued) <= 2 + 1
    assert at_start == 0
    assert parked >= 3 * n - 4
    assert wait <= bound
    for task_id in links:
        record = jobbers.get(task_id)
        assert (record.state, record.attempt) == (S.COMPLETED, 1), record
    assert int(client.get(f"{key}:big:max")) == 2
    assert jobbers.store.fair_held() == []


def test_a_chord_whose_header_is_a_keyed_group_gets_every_result(fair, workers):
    jobbers, client = fair.jobbers, fair.jobbers.store.client
    key = f"fair-{uuid.uuid4().hex[:8]}"
    body = chord(fair.item.s(key, "c", i) for i in range(12))(fair.gather.s(key))
    queued = _queued(client)
    wait_for(lambda: client.llen(f"{key}:gathered"), timeout=30, interval=0.05,
             message="the chord's callback")
    assert [int(v) for v in client.lrange(f"{key}:gathered", 0, -1)] == list(range(12))
    assert int(client.llen(f"{key}:items")) == 12  # each member ran once
    assert queued <= 2
    header = [r.id for r in body.parent.results]
    assert sum(1 for i in header if _parked(jobbers, i)) >= 8
    assert body.get(timeout=10) is None


def _bodies(marks: Path) -> list[tuple[float, float | None]]:
    """Each execution's (start, end) from fair_restart_proj's marks (end ``None``: running)."""
    out: list[tuple[float, float | None]] = []
    for mark in marks.iterdir():
        times = [float(t) for t in mark.read_text().split()]
        if times:
            out.append((times[0], times[1] if len(times) > 1 else None))
    return sorted(out)


def test_a_store_restart_in_the_middle_keeps_the_cap_and_runs_each_once(redis_url: str,
                                                                       tmp_path: Path) -> None:
    """Six tasks of one key at ``max_concurrent=1`` on a prefork worker (2 processes); the
    store (AOF ``always``, the broker elsewhere) is killed (SIGKILL) while the second runs
    and restarted once that body has ended (its end step and release wait the outage out).
    Every task completes, each body ran once, never two at once, and none waits for the
    parked tasks' 15-minute backstop."""
    from tests.integration.fair_restart_proj import build

    marks = tmp_path / "marks"
    marks.mkdir()
    with restartable_redis("always") as server:
        prefix = f"fr{uuid.uuid4().hex[:6]}"
        app = build(server.url(), redis_url, prefix)
        env = {"FAIR_RESTART_STORE": server.url(), "FAIR_RESTART_BROKER": redis_url,
               "FAIR_RESTART_PREFIX": prefix, "FAIR_RESTART_MARKS": str(marks)}
        worker = start_worker(app, "tests.integration.fair_restart_proj", tmp_path,
                              concurrency=2, env=env,
                              options=["--without-mingle", "--without-gossip",
                                       "--without-heartbeat", "--prefetch-multiplier", "1"])
        jobbers = get_jobbers(app)
        try:
            ids = [app.tasks["fr.one"].delay("t", 0.6).id for _ in range(6)]
            parked = sum(1 for i in ids if _parked(jobbers, i))
            wait_for(lambda: len(_bodies(marks)) >= 2, timeout=20, interval=0.01,
                     message="the second task to start")
            server.kill()
            killed = time.monotonic()
            wait_for(lambda: sum(end is not None for _, end in _bodies(marks)) >= 2,
                     timeout=10, interval=0.01, message="the second body to end")
            server.restart()
            down = time.monotonic() - killed

            def states() -> list[S | None]:
                try:
                    return [getattr(jobbers.get(i), "state", None) for i in ids]
                except Exception:  # noqa: BLE001 - the store coming back
                    return []

            try:
                wait_for(lambda: states() == [S.COMPLETED] * len(ids), timeout=60,
                         interval=0.1, message="every task to complete after the restart")
            except AssertionError:
                for i in ids:
                    print(i, [(t.to_state.value, t.reason) for t in jobbers.history(i)])
                raise
            took = time.monotonic() - killed
        finally:
            worker.kill()
        records = [jobbers.get(i) for i in ids]
    counts = executions(marks)
    bodies = _bodies(marks)
    print(f"\n6 tasks of one key at max_concurrent=1, {parked} parked at publish; store down "
          f"{down:.2f} s; all completed {took:.2f} s after the kill; attempts "
          f"{[r.attempt for r in records]}; runs per task {sorted(counts.values())}")
    assert parked >= 4  # one sent, the rest parked (the first may have started meanwhile)
    assert [counts.get(i, 0) for i in ids] == [1] * len(ids)  # none lost, none ran twice
    ended = [(start, end) for start, end in bodies if end is not None]
    assert len(ended) == len(bodies)
    assert all(later[0] >= earlier[1] for earlier, later in pairwise(ended))  # one at a time
