"""End to end: stall detection and recovery (heartbeats, worker liveness, the cleaner).

Real ``celery worker`` subprocesses are killed (SIGKILL of the whole process group) or
frozen (SIGSTOP); the session's private redis-server is frozen too. Where a test needs
cleaner passes while it watches, it runs them itself every ``jobbers_cleaner_interval``
from a thread (:class:`Beat`, standing in for celery beat); the real beat entry and the
workers' catch-up pass have tests of their own at the end.

The test app (``proj``) sets ``jobbers_worker_lost_after=3`` and
``jobbers_cleaner_interval=1``; ``proj.resumable`` has ``max_heartbeat_interval=2``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import pytest

from jobbers_celery import TaskState, cleaner
from jobbers_celery.cleaner import CleanReport
from jobbers_celery.config import JobbersConfig
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.liveness import gaps
from jobbers_celery.scheduler import Scheduler
from jobbers_celery.store import RedisStore
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.integration.beat_helpers import Beat
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    PUBLISH,
    START,
    ms,
    path,
    transitions,
    unique,
    wait_state,
)

T = TypeVar("T")

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState

LOST_AFTER_S = 3.0       # proj: jobbers_worker_lost_after
INTERVAL_S = 1.0         # proj: jobbers_cleaner_interval
MAX_HB_S = 2.0           # proj.resumable: max_heartbeat_interval

STALL = [(S.STARTED.value, S.STALLED.value), (S.STALLED.value, S.SUBMITTED.value)]

HB_REASON = re.compile(
    r"^stalled: no heartbeat for (?P<silent>\d+\.\d)s \(max_heartbeat_interval 2\.0s\); "
    r"last heartbeat (?P<hb>\S+); worker (?P<worker>\S+)$")
WORKER_REASON = re.compile(
    r"^stalled: worker (?P<worker>\S+) \((?P<wid>\S+)\) not seen for (?P<silent>\d+\.\d)s, "
    r"since (?P<seen>\S+) \(jobbers_worker_lost_after 3\.0s\); last heartbeat (?P<hb>\S+)$")


def iso_ms(text: str) -> int:
    return ms(datetime.fromisoformat(text))


@contextmanager
def ticking(store: RedisStore, wid: str = "live:1:tick00", period: float = 0.3) -> Iterator[str]:
    """A fake live worker: refreshes its liveness entry (and so ticks the clock) until exit,
    so no pause between cleaner passes looks like a Redis outage."""
    stop = threading.Event()
    gap = gaps(JobbersConfig(redis_url="redis://unused", worker_lost_after=LOST_AFTER_S,
                             cleaner_interval=1))

    def loop() -> None:
        while not stop.is_set():
            store.alive(wid, gap, [], int(LOST_AFTER_S * 1000))
            stop.wait(period)

    store.alive(wid, gap, [], int(LOST_AFTER_S * 1000))
    thread = threading.Thread(target=loop, name="test-ticker", daemon=True)
    thread.start()
    try:
        yield wid
    finally:
        stop.set()
        thread.join(10)


def fabricate(store: RedisStore, ids: list[str], *, wid: str, hb_ms: int | None,
              srec: int) -> None:
    """Records of started tasks, built through the store's own steps (as a worker would)."""
    msg = json.dumps({"args": [1, 2], "kwargs": {}, "options": {}})
    for task_id in ids:
        res = store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                         create={"name": "proj.add", "queue": "celery", "ver": "1", "dlq": "0"},
                         set_fields={"msg": msg, "retries": "0"}, reason="published",
                         name="proj.add")
        assert res.applied, res
        fields = {"srec": str(srec)}
        if hb_ms is not None:
            fields["hb_iv"] = str(hb_ms)
        res = store.step(task_id, S.STARTED, start=True, worker="ghost@localhost", wid=wid,
                         heartbeat_ms=hb_ms, set_fields=fields, name="proj.add")
        assert res.applied, res
        assert res.attempt == 1, res


def at_once(*calls: Callable[[], T]) -> list[T]:
    """Run ``calls`` in threads released together; their results (errors re-raised)."""
    barrier = threading.Barrier(len(calls))

    def released(call: Callable[[], T]) -> T:
        barrier.wait(10)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(released, call) for call in calls]
        return [f.result(timeout=120) for f in futures]


def worker_running(jobbers: Any, task_id: str, workers: list[Any]) -> Any:
    record = wait_state(jobbers, task_id, S.STARTED)
    [worker] = [w for w in workers if w.name == record.worker]
    return worker


def stop_group(worker: Any, sig: int) -> None:
    os.killpg(worker.proc.pid, sig)


# --------------------------------------------------------------------------- 1. SIGKILL


@pytest.mark.parametrize(("task", "pool"), [("resumable", "prefork"), ("silent", "threads")])
def test_killed_worker_task_is_stalled_and_resumed_once_on_another_worker(
        proj, worker_factory, task, pool):
    """The whole worker is SIGKILLed mid-task. ``resumable`` heartbeats (the verdict may
    come from its heartbeat deadline or from worker liveness); ``silent`` never does, so
    only worker liveness finds it. Both are recovered once (max_stall_recoveries=1) and
    complete on the other worker; ``resumable`` resumes at its checkpoint."""
    jobbers = proj.jobbers
    workers = [worker_factory(pool=pool, concurrency=1) for _ in range(2)]
    key = unique(task)
    steps = 8
    with Beat(jobbers) as beat:
        if task == "resumable":
            result = proj.resumable.delay(key, steps, 0.5)
        else:
            result = proj.silent.delay(key, 2.0)
        victim = worker_running(jobbers, result.id, workers)
        [survivor] = [w for w in workers if w is not victim]
        if task == "resumable":  # a few steps done, checkpoints saved
            wait_for(lambda: jobbers.store.client.llen(key) >= 3, message="three steps")
        else:
            wait_for(lambda: jobbers.store.client.llen(key) >= 1, message="the task body")
        started = jobbers.get(result.id)

        stop_group(victim, signal.SIGKILL)
        victim.proc.wait(10)
        killed_ms = jobbers.store.now_ms()

        wait_for(lambda: transitions(jobbers, result.id, S.STALLED), timeout=15,
                 message="the stall verdict")
        done = wait_state(jobbers, result.id, S.COMPLETED, timeout=30, worker=survivor)
    assert not beat.errors

    [stalled] = transitions(jobbers, result.id, S.STALLED)
    latency_ms = ms(stalled.at) - killed_ms
    print(f"\n[{task}/{pool}] kill -> stalled: {latency_ms} ms "
          f"(bound {LOST_AFTER_S + 2 * INTERVAL_S:.0f} s); {stalled.reason}")
    assert 0 < latency_ms <= (LOST_AFTER_S + 2 * INTERVAL_S) * 1000
    assert stalled.attempt == 1
    assert stalled.worker == victim.name

    # the evidence: which clock ran out, when the task or its worker was last heard of
    hb = worker_seen = None
    if (m := HB_REASON.match(stalled.reason or "")) is not None:
        assert task == "resumable", "silent has no max_heartbeat_interval"
        hb = iso_ms(m["hb"])
        assert float(m["silent"]) >= MAX_HB_S  # printed to 0.1 s
        assert m["worker"] == victim.name
    else:
        m = WORKER_REASON.match(stalled.reason or "")
        assert m is not None, stalled.reason
        assert m["worker"] == victim.name
        assert m["wid"].startswith(f"{victim.name}:{victim.proc.pid}:")
        worker_seen = iso_ms(m["seen"])
        hb = iso_ms(m["hb"])
        assert float(m["silent"]) >= LOST_AFTER_S  # printed to 0.1 s
        # seen alive shortly before the kill: it refreshes every 0.6 s
        assert killed_ms - 2000 <= worker_seen <= killed_ms
    if task == "silent":
        assert worker_seen is not None, "a task without heartbeats is found by liveness"
        assert hb == ms(started.heartbeat_at)  # the start step stamps it
    assert ms(started.started_at) <= hb <= killed_ms

    # recovered once, same id, attempt 2 on the survivor, completed
    assert path(jobbers, result.id) == PUBLISH + START + STALL + START + COMPLETE
    history = jobbers.history(result.id)
    assert [t.attempt for t in history] == [0, 1, 1, 1, 2, 2]
    assert history[3].reason == "stall recovery 1 of 1"
    assert history[4].worker == survivor.name
    assert done.attempt == 2
    assert done.worker == survivor.name

    runs = jobbers.store.client.lrange(key, 0, -1)
    if task == "resumable":
        first = [int(r[2:]) for r in runs if r.startswith("1:")]
        second = [int(r[2:]) for r in runs if r.startswith("2:")]
        assert len(first) + len(second) == len(runs), runs
        assert first == list(range(len(first)))
        # resumed at its checkpoint: the step in flight at the kill is the only one done twice
        assert second == list(range(second[0], steps))
        assert second[0] in (len(first) - 1, len(first)), runs
        assert second[0] >= 2
        assert done.checkpoint == steps
        assert result.get(timeout=10) == steps
        print(f"[{task}/{pool}] runs: {runs}")
    else:
        assert [r.split(":", 1)[0] for r in runs] == ["1", "2"], runs
        assert runs[1].endswith(f":{survivor.name}")
        assert result.get(timeout=10) == "done"

    # the dead incarnation is forgotten once it has no task left
    wid = f"{victim.name}:{victim.proc.pid}:"
    wait_for(lambda: not any(w.startswith(wid) for w in
                             jobbers.store.client.zrange(jobbers.store.keys.workers, 0, -1)),
             timeout=10, message="the dead incarnation to be forgotten")


# --------------------------------------------------------------------------- 2. SIGSTOP


def test_frozen_worker_is_superseded_and_its_late_heartbeat_rejected(proj, worker_factory):
    jobbers = proj.jobbers
    stats = jobbers.store.keys.stats
    workers = [worker_factory(pool="prefork", concurrency=1) for _ in range(2)]
    key = unique("frozen")
    steps = 8
    with Beat(jobbers) as beat:
        result = proj.resumable.delay(key, steps, 0.5)
        frozen = worker_running(jobbers, result.id, workers)
        [other] = [w for w in workers if w is not frozen]
        wait_for(lambda: jobbers.store.client.llen(key) >= 3, message="three steps")
        stop_group(frozen, signal.SIGSTOP)
        try:
            stopped_ms = jobbers.store.now_ms()
            record = wait_for(
                lambda: (r := jobbers.get(result.id)) and r.attempt == 2
                and r.state in (S.STARTED, S.COMPLETED) and r,
                timeout=20, message="attempt 2 running on the other worker")
            assert record.worker == other.name
            rejected_before = int(jobbers.store.client.hget(stats, "rejected:heartbeat") or 0)
            before_cont = jobbers.store.client.lrange(key, 0, -1)
        finally:
            stop_group(frozen, signal.SIGCONT)
        resumed_ms = jobbers.store.now_ms()

        # the old attempt wakes up, heartbeats, is told it was superseded, and stops
        wait_for(lambda: int(jobbers.store.client.hget(stats, "rejected:heartbeat") or 0)
                 == rejected_before + 1, timeout=10, message="the late heartbeat rejected")
        wait_for(lambda: "attempt 1 is no longer the running attempt" in frozen.log,
                 timeout=10, message="AttemptSuperseded in the frozen worker's log")
        done = wait_state(jobbers, result.id, S.COMPLETED, timeout=30, worker=other)
    assert not beat.errors
    assert frozen.proc.poll() is None, "the frozen worker goes on after SIGCONT"

    [stalled] = transitions(jobbers, result.id, S.STALLED)
    latency_ms = ms(stalled.at) - stopped_ms
    print(f"\nSIGSTOP -> stalled: {latency_ms} ms; SIGCONT -> heartbeat rejected; "
          f"{stalled.reason}")
    assert stalled.attempt == 1
    m = HB_REASON.match(stalled.reason or "") or WORKER_REASON.match(stalled.reason or "")
    assert m is not None, stalled.reason
    assert m["worker"] == frozen.name
    assert latency_ms <= (LOST_AFTER_S + 2 * INTERVAL_S) * 1000

    # the record shows the new attempt only, completed by it
    assert path(jobbers, result.id) == PUBLISH + START + STALL + START + COMPLETE
    [completed] = transitions(jobbers, result.id, S.COMPLETED)
    assert completed.attempt == 2
    assert completed.worker == other.name
    assert done.attempt == 2
    assert done.worker == other.name
    assert done.checkpoint == steps
    assert result.get(timeout=10) == steps
    assert int(jobbers.store.client.hget(stats, "rejected:heartbeat") or 0) == rejected_before + 1

    # after SIGCONT the old attempt did at most the step it was in (no new step after it)
    runs = jobbers.store.client.lrange(key, 0, -1)
    old_before = [r for r in before_cont if r.startswith("1:")]
    old_after = [r for r in runs if r.startswith("1:")]
    assert len(old_after) - len(old_before) <= 1, runs
    new = [int(r[2:]) for r in runs if r.startswith("2:")]
    assert new == list(range(new[0], steps)), runs
    print(f"runs: {runs} (SIGCONT at {resumed_ms - stopped_ms} ms after SIGSTOP)")


# --------------------------------------------------------------------------- 3. two cleaners


def drain(jobbers: Jobbers, by: str) -> list[CleanReport]:
    """Cleaner passes until one finds nothing to judge."""
    reports: list[CleanReport] = []
    while not reports or reports[-1].examined:
        assert len(reports) < 50
        reports.append(jobbers.cleaner.run(by=by))
    return reports


def test_two_cleaners_over_500_stale_tasks_recover_each_exactly_once(proj, monkeypatch):
    # 100 candidates of each kind per pass: the two cleaners' passes interleave
    monkeypatch.setattr(cleaner, "PASS_LIMIT", 100)
    store = proj.jobbers.store
    client = store.client
    n = 250
    by_hb = [f"hb-{i:03d}" for i in range(n)]
    by_worker = [f"wk-{i:03d}" for i in range(n)]
    dead_wid = "dead:1:abc"
    cleaners = [Jobbers(proj.app, proj.jobbers.config) for _ in range(2)]
    try:
        with ticking(store) as live_wid:
            # heartbeat deadlines (1 ms) pass at once; the dead worker was last seen long ago
            fabricate(store, by_hb, wid=live_wid, hb_ms=1, srec=1)
            fabricate(store, by_worker, wid=dead_wid, hb_ms=None, srec=1)
            client.zadd(store.keys.workers, {dead_wid: store.now_ms() - 60_000})
            # silence counts from the first tick of this fresh database (no grace left)
            wait_for(lambda: store.now_ms() - int(store.clock()["resumed_at"])
                     > LOST_AFTER_S * 1000 + 200, timeout=10, message="the grace to end")

            got = [r for rs in at_once(*(functools.partial(drain, j, f"cleaner {i}")
                                         for i, j in enumerate(cleaners))) for r in rs]
            again = proj.jobbers.cleaner.run(by="third")
    finally:
        for j in cleaners:
            j.store.client.close()

    print("\n" + "; ".join(f"{r.by}: examined {r.examined}, stalled {r.stalled}, kept {r.kept},"
                           f" {r.duration_ms:.0f} ms" for r in got if r.examined))
    assert sum(r.stalled for r in got) == 2 * n
    recovered = [i for r in got for i in r.recovered]
    assert len(recovered) == len(set(recovered)) == 2 * n
    assert set(recovered) == {*by_hb, *by_worker}
    assert not any(r.dead_lettered for r in got)
    assert again.stalled == 0
    assert again.recovered == []

    for task_id in (*by_hb, *by_worker):
        hist = store.history(task_id)
        moves = [(t.from_state, t.to_state) for t in hist]
        assert moves.count((S.STARTED, S.STALLED)) == 1, (task_id, moves)
        assert moves.count((S.STALLED, S.SUBMITTED)) == 1, (task_id, moves)
        assert moves[-2:] == [(S.STARTED, S.STALLED), (S.STALLED, S.SUBMITTED)]
        reason = hist[-2].reason or ""
        assert reason.startswith("stalled: no heartbeat" if task_id.startswith("hb-")
                                 else f"stalled: worker ghost@localhost ({dead_wid})"), reason
        raw = store.get_raw(task_id)
        assert (raw["state"], raw["attempt"], raw["stalls"]) == ("submitted", "1", "1")
    # republished exactly once each: one broker message per task id (what a pass's publish
    # budget left over goes out with a worker scheduler's poll, run here as a worker would)
    scheduler = Scheduler(proj.jobbers, "test-scheduler")
    while scheduler.run_once()[0]:
        pass
    assert client.zcard(store.keys.publishing) == 0
    published = Counter(json.loads(m)["headers"]["id"] for m in client.lrange("celery", 0, -1))
    assert published == Counter({i: 1 for i in recovered})
    # indexes tidy: nothing started, no heartbeat deadline, the dead incarnation forgotten
    assert store.counts()[S.STARTED] == 0
    assert client.zcard(store.keys.heartbeat_due) == 0
    assert client.zscore(store.keys.workers, dead_wid) is None


# --------------------------------------------------------------------------- 4. Redis paused


def test_redis_paused_past_the_thresholds_stalls_nothing(proj, worker_factory, redis_server):
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=4)
    key = unique("paused")
    pause_s = 5.0  # longer than max_heartbeat_interval (2 s) and worker_lost_after (3 s)
    with Beat(jobbers) as beat:
        results = [proj.resumable.delay(key, 6, 0.4) for _ in range(2)]
        results += [proj.silent.delay(key, pause_s + 1.5) for _ in range(2)]
        for r in results:
            wait_state(jobbers, r.id, S.STARTED, worker=worker)
        wait_for(lambda: jobbers.store.client.llen(key) >= 6, message="a few steps")
        before_ms = jobbers.store.now_ms()
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(pause_s)  # the outage itself: nothing can be polled meanwhile
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        # the cleaner, over and over, while everything catches up
        after: list[CleanReport] = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            after.append(jobbers.cleaner.run(by="after the pause"))
            time.sleep(0.2)
        records = [wait_state(jobbers, r.id, S.COMPLETED, S.STALLED, timeout=30, worker=worker)
                   for r in results]
    assert not beat.errors

    clock = jobbers.store.clock()
    print(f"\nRedis paused {pause_s:.0f} s: gap seen {clock['gap_ms']} ms; after it "
          f"{len(after)} passes, kept {sum(r.kept for r in after)} "
          f"(beat passes: {len(beat.reports)}, kept {sum(r.kept for r in beat.reports)})")
    # the outage was noticed: silence is counted from its end
    assert int(clock["gap_ms"]) >= (pause_s - 1) * 1000
    assert int(clock["resumed_at"]) >= before_ms + (pause_s - 1) * 1000
    assert [r.stalled for r in after + beat.reports] == [0] * (len(after) + len(beat.reports))
    # nobody stalled anything: neither these passes nor a worker's catch-up pass
    for r, record in zip(results, records, strict=True):
        assert transitions(jobbers, r.id, S.STALLED) == []
        assert path(jobbers, r.id) == PUBLISH + START + COMPLETE
        assert record.state == S.COMPLETED
        assert record.attempt == 1


def test_passes_slower_than_the_outage_gap_still_stall_a_dead_workers_tasks(proj):
    """The only worker dies; passes come from ``jobbers.clean()`` outside any worker (a cron
    job) every ``jobbers_cleaner_interval`` = 2 s, slower than the 1.8 s outage gap of
    worker_lost_after=3, as with the defaults (10 s passes, 6 s gap)."""
    store = proj.jobbers.store
    every = 2.0
    cron = Jobbers(proj.app, dataclasses.replace(proj.jobbers.config, cleaner_interval=every))
    with ticking(store, wid="solo:1:abc000") as wid:  # the only worker, alive
        fabricate(store, ["orphan"], wid=wid, hb_ms=None, srec=0)
    died_ms = store.now_ms()  # it stops refreshing: dead
    with Beat(cron, interval=every) as beat:
        try:
            wait_for(lambda: transitions(proj.jobbers, "orphan", S.STALLED),
                     timeout=LOST_AFTER_S + 2 * every + 1, interval=0.1, message="stalled")
        finally:
            print(f"\npasses every {every:.0f} s, no worker alive: " + ", ".join(
                f"kept {r.kept} (resumed_at +{ms(r.resumed_at) - died_ms} ms)"
                for r in beat.reports if r.resumed_at is not None))
    cron.store.client.close()
    [stalled] = transitions(proj.jobbers, "orphan", S.STALLED)
    assert ms(stalled.at) - died_ms <= (LOST_AFTER_S + 2 * every) * 1000


def test_a_worker_reports_no_orphan_until_the_grace_after_an_outage_is_over(proj):
    """A task recorded as started by a live worker that does not run it is an orphan (its
    end was lost), but not within ``orphan_grace_ms`` of the end of an outage: a message
    given back may still take that start back, a held outcome still land."""
    store = proj.jobbers.store
    wid = "grace:1:abc000"
    gap = gaps(JobbersConfig(redis_url="redis://unused", worker_lost_after=LOST_AFTER_S,
                             cleaner_interval=1))
    fabricate(store, ["held"], wid=wid, hb_ms=None, srec=0)
    time.sleep(0.1)  # started longer than orphan_ms ago

    def orphans(resumed_ago_ms: int) -> list[str]:
        store.client.hset(store.keys.clock, "resumed_at", store.now_ms() - resumed_ago_ms)
        return store.alive(wid, gap, [], 1000, running=[], orphan_ms=50,
                           orphan_grace_ms=5000).orphans

    assert orphans(1000) == []  # 1 s after the outage: within the grace
    assert orphans(6000) == ["held"]


# --------------------------------------------------------------------------- 5. cleaner vs completion


def test_cleaner_racing_completions_never_both_win(proj, make_store, monkeypatch):
    store = proj.jobbers.store
    completer = make_store(prefix=proj.jobbers.config.key_prefix)
    monkeypatch.setattr(cleaner, "PASS_LIMIT", 20)  # many small verdict batches
    outcomes: Counter[str] = Counter()
    with ticking(store) as wid:
        for round_ in range(3):
            ids = [f"race-{round_}-{i:03d}" for i in range(150)]
            fabricate(store, ids, wid=wid, hb_ms=1, srec=0)  # stale at once, no recovery
            completed: dict[str, bool] = {}

            def complete(ids: list[str] = ids, completed: dict[str, bool] = completed) -> None:
                for task_id in reversed(ids):  # meets the cleaner (oldest first) midway
                    res = completer.step(task_id, S.COMPLETED, sources=(S.STARTED,), fence=1,
                                         worker="ghost@localhost", delete=("msg",),
                                         wid=wid, name="proj.add")
                    completed[task_id] = res.applied

            def clean(ids: list[str] = ids) -> None:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and any(
                        s == "started"
                        for s in (store.client.hget(store.keys.task(i), "state") for i in ids)):
                    proj.jobbers.cleaner.run(by="racer")

            at_once(complete, clean)
            assert len(completed) == len(ids)

            for task_id in ids:
                moves = [(t.from_state, t.to_state, t.attempt) for t in store.history(task_id)]
                ends = [m for m in moves if m[0] == S.STARTED]
                assert len(ends) == 1, (task_id, moves)  # one verdict, never both
                end = ends[0][1]
                assert end in (S.COMPLETED, S.STALLED)
                assert completed[task_id] == (end == S.COMPLETED), (task_id, moves)
                assert store.get_raw(task_id)["state"] == end.value
                outcomes[end.value] += 1
    print(f"\ncleaner vs completion over 450 tasks: {dict(outcomes)}")
    assert sum(outcomes.values()) == 450
    assert outcomes["completed"] > 0, "the two never met"
    assert outcomes["stalled"] > 0, "the two never met"


# --------------------------------------------------------------------------- 6. health


def test_cleaner_status_overdue_and_a_workers_catch_up_pass(proj, worker_factory):
    jobbers = proj.jobbers
    status = jobbers.cleaner_status()
    assert status.last_run_at is None
    assert status.last_duration_ms is None
    assert status.overdue

    report = jobbers.clean()
    status = jobbers.cleaner_status()
    assert status.last_run_at == report.at
    assert status.last_duration_ms == pytest.approx(report.duration_ms, abs=0.001)
    assert status.by == "clean()"
    assert not status.overdue
    assert status.last_report == report.as_dict()

    # no pass for three intervals (no beat, no worker): overdue
    wait_for(lambda: jobbers.cleaner_status().overdue, timeout=3 * INTERVAL_S + 5,
             interval=0.05, message="overdue")
    waited = jobbers.store.now_ms() - ms(report.at)
    assert waited >= 3 * INTERVAL_S * 1000

    # a worker notices and runs a catch-up pass itself (once: under a lock)
    launched_ms = jobbers.store.now_ms()
    worker = worker_factory(pool="threads", concurrency=1)
    status = wait_for(lambda: (s := jobbers.cleaner_status()).by != "clean()" and s,
                      timeout=10, message="a catch-up pass")
    assert status.by == f"catch-up in {worker.name}"
    assert status.by.startswith("catch-up")
    assert not status.overdue
    assert status.last_run_at is not None
    assert status.last_run_at > report.at
    assert status.last_duration_ms is not None
    assert status.last_duration_ms > 0
    print(f"\ncatch-up pass {ms(status.last_run_at) - launched_ms} ms after the worker was "
          f"launched (took {status.last_duration_ms:.1f} ms)")
    assert worker.log.count("catching up") == 1


# --------------------------------------------------------------------------- 7. beat


def test_celery_beat_runs_the_cleaner_every_interval(proj, worker_factory, tmp_path):
    entry = proj.app.conf.beat_schedule["jobbers.clean"]
    assert entry["task"] == "jobbers.clean"
    assert entry["schedule"] == proj.jobbers.config.cleaner_interval == INTERVAL_S
    # a message older than one interval expires unrun (the entry's option or the task's own)
    expires = (entry.get("options") or {}).get("expires", proj.app.tasks["jobbers.clean"].expires)
    assert expires == INTERVAL_S

    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "beat",
         "-s", str(tmp_path / "schedule"), "--pidfile", str(tmp_path / "beat.pid"),
         "-l", "INFO"],
        cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        worker_factory(pool="threads", concurrency=2)

        def by_beat() -> Any:
            return (s := proj.jobbers.cleaner_status()).by == "beat" and s

        first = wait_for(by_beat, timeout=15, message="a pass run by beat")
        second = wait_for(lambda: (s := by_beat()) and s.last_run_at > first.last_run_at and s,
                          timeout=10, message="the next beat pass")
    finally:
        beat.send_signal(signal.SIGTERM)
        try:
            beat.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(beat.pid, signal.SIGKILL)
            beat.wait(5)
    gap = (second.last_run_at - first.last_run_at).total_seconds()
    print(f"\nbeat passes {gap:.2f} s apart; last took {second.last_duration_ms:.1f} ms")
    assert second.last_report["by"] == "beat"
    assert 0.5 <= gap <= 3 * INTERVAL_S
