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
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from jobbers_celery import TaskState
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle.cleaner import Cleaner, CleanReport
from jobbers_celery.lifecycle.liveness import gaps
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.integration import stall_cases
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
from tests.integration.stall_cases import (
    HB_REASON,
    INTERVAL_S,
    STALL,
    WORKER_REASON,
    stop_group,
    worker_running,
)
from tests.integration.stall_helpers import (
    LOST_AFTER_S,
    fabricate,
    last_seen,
    resumed_at,
    ticking,
)

T = TypeVar("T")

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState


def at_once(*calls: Callable[[], T]) -> list[T]:
    """Run ``calls`` in threads released together; their results (errors re-raised)."""
    barrier = threading.Barrier(len(calls))

    def released(call: Callable[[], T]) -> T:
        barrier.wait(10)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(released, call) for call in calls]
        return [f.result(timeout=120) for f in futures]


# --------------------------------------------------------------------------- 1. SIGKILL


@pytest.mark.parametrize(("task", "pool"), [("resumable", "prefork"), ("silent", "threads")])
def test_killed_worker_task_is_stalled_and_resumed_once_on_another_worker(
        proj, worker_factory, task, pool):
    stall_cases.killed_worker_task_is_stalled_and_resumed_once_on_another_worker(proj, worker_factory, task, pool)


# --------------------------------------------------------------------------- 2. SIGSTOP


def test_frozen_worker_is_superseded_and_its_late_heartbeat_rejected(proj, worker_factory):
    jobbers = proj.jobbers
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
            rejected_before = jobbers.store.refused_counts().get("rejected:heartbeat", 0)
            before_cont = jobbers.store.client.lrange(key, 0, -1)
        finally:
            stop_group(frozen, signal.SIGCONT)
        resumed_ms = jobbers.store.now_ms()

        # the old attempt wakes up and stops: its heartbeat is rejected (it is told it was
        # superseded), or its worker's liveness refresh, waking up with it, ends it first
        # (SIGTERM: the stall verdict was on an attempt the worker still runs)
        superseded = "attempt 1 is no longer the running attempt"
        ended = f"ending proj.resumable[{result.id}] attempt 1: declared stalled"
        wait_for(lambda: superseded in frozen.log or ended in frozen.log, timeout=10,
                 message="AttemptSuperseded, or the attempt ended by its worker")
        done = wait_state(jobbers, result.id, S.COMPLETED, timeout=30, worker=other)
        rejected = jobbers.store.refused_counts().get("rejected:heartbeat", 0)
        if ended in frozen.log:
            wait_for(lambda: "; ended by its worker (SIGTERM "
                     in (transitions(jobbers, result.id, S.STALLED)[0].reason or ""),
                     timeout=10, message="the note on the stall")
            assert rejected in (rejected_before, rejected_before + 1)
        else:
            assert rejected == rejected_before + 1
    assert not beat.errors
    assert frozen.proc.poll() is None, "the frozen worker goes on after SIGCONT"

    [stalled] = transitions(jobbers, result.id, S.STALLED)
    latency_ms = ms(stalled.at) - stopped_ms
    how = "ended by its worker" if ended in frozen.log else "heartbeat rejected"
    print(f"\nSIGSTOP -> stalled: {latency_ms} ms; SIGCONT -> {how}; {stalled.reason}")
    assert stalled.attempt == 1
    reason = (stalled.reason or "").split("; ended by its worker")[0]
    m = HB_REASON.match(reason) or WORKER_REASON.match(reason)
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
    assert jobbers.store.refused_counts().get("rejected:heartbeat", 0) == rejected

    # after SIGCONT the old attempt did at most the step it was in (no new step after it)
    runs = jobbers.store.client.lrange(key, 0, -1)
    old_before = [r for r in before_cont if r.startswith("1:")]
    old_after = [r for r in runs if r.startswith("1:")]
    assert len(old_after) - len(old_before) <= 1, runs
    new = [int(r[2:]) for r in runs if r.startswith("2:")]
    assert new == list(range(new[0], steps)), runs
    print(f"runs: {runs} (SIGCONT at {resumed_ms - stopped_ms} ms after SIGSTOP)")


# --------------------------------------------------------------------------- 2b. frozen tasks

CANNOT_STOP = "this worker's pool cannot stop a running task"


def test_a_frozen_task_is_ended_by_its_worker_and_its_slot_runs_the_next(proj, worker_factory,
                                                                          r):
    stall_cases.frozen_task_is_ended_by_its_worker_and_its_slot_runs_the_next(
        proj, worker_factory, r)


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_a_frozen_task_on_threads_or_solo_is_reported_once_and_keeps_its_slot(
        proj, worker_factory, pool):
    """threads -c 1, solo: a thread cannot be stopped. The worker warns once for the stalled
    attempt (not at each of the liveness refreshes while it runs), the history says so, the
    attempt keeps the one slot until it returns, its late completion is refused, and then
    the recovered attempt runs in that slot."""
    jobbers = proj.jobbers
    client = jobbers.store.client
    worker = worker_factory(pool=pool, concurrency=1)
    frozen_s = 5.0  # several refreshes (every 0.6 s) after the verdict (after 1-2 s)
    with Beat(jobbers) as beat:
        key = unique("freezes")
        result = proj.freezes.delay(key, frozen_s)
        wait_state(jobbers, result.id, S.COMPLETED, timeout=40, worker=worker)
        assert result.get(timeout=10) == 2
        wait_for(lambda: f"freezes[{result.id}] attempt 1 rejected" in worker.log,
                 timeout=10, message="the late completion of attempt 1 refused")
    assert not beat.errors
    log = worker.log
    assert log.count(CANNOT_STOP) == 1, log
    assert f"freezes[{result.id}] attempt 1 was declared stalled" in log
    [stalled] = transitions(jobbers, result.id, S.STALLED)
    assert (stalled.reason or "").endswith(
        "; its worker's pool cannot stop it: it keeps its slot until it returns"), stalled
    assert stalled.attempt == 1
    assert path(jobbers, result.id) == PUBLISH + START + STALL + START + COMPLETE
    assert [r.split(":")[0] for r in client.lrange(key, 0, -1)] == ["1", "2"]
    [_, second] = transitions(jobbers, result.id, S.STARTED)
    print(f"\n[{pool}] verdict -> attempt 2 started: {ms(second.at) - ms(stalled.at)} ms "
          f"(the slot held until attempt 1 returned, {frozen_s:g} s after it started)")


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
    store = proj.jobbers.store
    client = store.client
    n = 250
    by_hb = [f"hb-{i:03d}" for i in range(n)]
    by_worker = [f"wk-{i:03d}" for i in range(n)]
    dead_wid = "dead:1:abc"
    cleaners = [Jobbers(proj.app, proj.jobbers.config) for _ in range(2)]
    for j in (*cleaners, proj.jobbers):
        monkeypatch.setattr(j, "cleaner", Cleaner(j.store, j.config, j.recorder, j.publisher,
                                                  pass_limit=100))
    try:
        with ticking(store) as live_wid:
            # heartbeat deadlines (1 ms) pass at once; the dead worker was last seen long ago
            fabricate(store, by_hb, wid=live_wid, hb_ms=1, srec=1)
            fabricate(store, by_worker, wid=dead_wid, hb_ms=None, srec=1)
            last_seen(store, dead_wid, store.now_ms() - 60_000)
            # silence counts from the first tick of this fresh database (no grace left)
            wait_for(lambda: store.now_ms() - resumed_at(store)
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
    scheduler = proj.jobbers.scheduler("test-scheduler")
    while scheduler.run_once()[0]:
        pass
    assert sum(client.zcard(k.publishing) for k in store.shards.keys) == 0
    published = Counter(json.loads(m)["headers"]["id"] for m in client.lrange("celery", 0, -1))
    assert published == Counter({i: 1 for i in recovered})
    # indexes tidy: nothing started, no heartbeat deadline, the dead incarnation forgotten
    assert store.counts()[S.STARTED] == 0
    assert sum(client.zcard(k.heartbeat_due) for k in store.shards.keys) == 0
    assert last_seen(store, dead_wid) == [None] * store.shards.count


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

    clock = jobbers.store.client.hgetall(jobbers.store.shards.keys[0].clock)
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


def test_everyones_silence_shorter_than_an_outage_is_not_a_tasks_silence(proj):
    """Redis refusing everything (full memory, a pause) for less than the outage gap but for
    longer than a task's max_heartbeat_interval: no sign of life reached it, so its
    heartbeats may have been refused too. Seen with real workers: a 4 s full memory stalled
    4 live heartbeating tasks, the cleaner's pass reaching Redis 10 ms before their
    heartbeats, and ran them twice. The verdict leaves that window out, and still stalls the
    task once it stays silent while its worker is heard."""
    store, cleaner = proj.jobbers.store, proj.jobbers.cleaner
    # the worker's gaps: quiet past 2 s (1.5 refresh periods), an outage past 4 s; wide, so
    # that a loaded machine's delays keep the silence below between the two
    gap = (4000, 4000)
    wid = "live:1:quiet0"
    store.alive(wid, gap, [], int(LOST_AFTER_S * 1000))
    fabricate(store, ["quiet"], wid=wid, hb_ms=1000, srec=1)
    time.sleep(2.5)  # everyone's silence itself (nothing to poll): 2 s < 2.5 s < 4 s
    store.alive(wid, gap, [], int(LOST_AFTER_S * 1000))  # the worker is heard first
    first = cleaner.run(by="after the quiet")
    assert (first.stalled, first.kept) == (0, 1), first
    clock = store.client.hgetall(store.shards.keys[0].clock)
    assert 2000 < int(clock["quiet_to"]) - int(clock["quiet_from"]) <= 4000, clock
    # silent while its worker is heard: stalled, one max_heartbeat_interval later
    began = time.monotonic()
    with ticking(store, wid=wid, period=0.1):
        wait_for(lambda: cleaner.run(by="heard").stalled == 1, timeout=15, interval=0.05,
                 message="the stall verdict")
    assert time.monotonic() - began < 10
    [stalled] = transitions(proj.jobbers, "quiet", S.STALLED)
    assert (stalled.reason or "").startswith("stalled: no heartbeat for"), stalled


def test_a_worker_reports_no_orphan_until_the_grace_after_an_outage_is_over(proj):
    """A task recorded as started by a live worker that does not run it is an orphan (its
    end was lost), but not within ``orphan_grace_ms`` of the end of an outage: a message
    given back may still take that start back, a held outcome still land."""
    store = proj.jobbers.store
    wid = "grace:1:abc000"
    gap = gaps(JobbersConfig(redis_url="redis://unused", worker_lost_after=LOST_AFTER_S,
                             cleaner_interval=1))
    started_ms = store.now_ms()
    fabricate(store, ["held"], wid=wid, hb_ms=None, srec=0)
    # started longer than orphan_ms (50) ago, by the Redis clock
    wait_for(lambda: store.now_ms() > started_ms + 100, timeout=5, interval=0.01,
             message="the Redis clock to pass orphan_ms")

    def orphans(resumed_ago_ms: int) -> list[str]:
        for k in store.shards.keys:  # every shard's clock: the outage was the server's
            store.client.hset(k.clock, "resumed_at", store.now_ms() - resumed_ago_ms)
        return store.alive(wid, gap, [], 1000, running=[], orphan_ms=50,
                           orphan_grace_ms=5000).orphans

    assert orphans(1000) == []  # 1 s after the outage: within the grace
    assert orphans(6000) == ["held"]


# --------------------------------------------------------------------------- 5. cleaner vs completion


def test_cleaner_racing_completions_never_both_win(proj, make_store, monkeypatch):
    store = proj.jobbers.store
    completer = make_store(prefix=proj.jobbers.config.key_prefix)
    jobbers = proj.jobbers
    racer = Cleaner(store, jobbers.config, jobbers.recorder, jobbers.publisher,
                    pass_limit=20)  # many small verdict batches
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
                        for s in (store.client.hget(store.keys_of(i).task(i), "state") for i in ids)):
                    racer.run(by="racer")

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

    # The worker first: beat's messages (expires = one interval) then run as they come.
    # Started after beat, the worker found them queued and ran the newest unexpired one at
    # once, up to an interval old, so the next pass could follow it by well under 0.5 s.
    worker_factory(pool="threads", concurrency=2)
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "beat",
         "-s", str(tmp_path / "schedule"), "--pidfile", str(tmp_path / "beat.pid"),
         "-l", "INFO"],
        cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
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
