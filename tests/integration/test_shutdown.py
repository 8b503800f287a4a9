"""End to end: per-task shutdown policies (``on_shutdown``, issue 4) on real workers.

Each test starts a real ``celery worker``, lets tasks of each policy run, signals the worker
and, once it has exited, checks every task's record. A task that must run again is then run
by a second worker, started only after the first one exited. The tasks (``proj.on_stop``,
``proj.on_resubmit``, ``proj.on_continue``; ``proj.silent`` never heartbeats) log
"<attempt>:<pid>:<worker>" when their body starts and "<attempt>:done" when it ends, so
their Redis list shows how often each body ran and where. At the end the broker holds
nothing (queued or unacknowledged): no message is left that could run anything again.

- prefork: SIGTERM to the main pid (warm), SIGQUIT and ``REMAP_SIGTERM=SIGQUIT`` with a soft
  shutdown timeout (cold), SIGTERM to the whole process group;
- threads and solo: SIGTERM; the next ``heartbeat()`` of a stop/resubmit task raises.

``proj.on_resubmit_ckpt`` also checkpoints (and logs the checkpoint and retry count each
attempt starts with); ``proj.on_resubmit_slow`` takes ``PROJ_SLOW_PUBLISH`` seconds to
publish its resubmission; ``PROJ_SOFT_SHUTDOWN`` sets ``worker_soft_shutdown_timeout``.

``JOBBERS_SHUTDOWN_REPORT=1`` prints what each shutdown did and how long it took.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    PUBLISH,
    START,
    dead_letters,
    path,
    transitions,
    unique,
    wait_state,
)

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState

LOST_AFTER_S = 3.0  # proj: jobbers_worker_lost_after
SOFT_SHUTDOWN_S = 1.0  # PROJ_SOFT_SHUTDOWN for the cold shutdowns
LONG_S = 10.0  # a stop task: never reaches its end here

#: kind -> (proj task, its on_shutdown)
KINDS = {
    "stop": ("on_stop", "stop"),
    "resubmit": ("on_resubmit", "resubmit"),
    "continue": ("on_continue", "continue"),
    "silent": ("silent", "stop"),  # never heartbeats
    "checkpoint": ("on_resubmit_ckpt", "resubmit"),  # checkpoints every step
    "slow": ("on_resubmit_slow", "resubmit"),  # publishes its resubmission slowly
}

_observed: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if os.environ.get("JOBBERS_SHUTDOWN_REPORT") and _observed:
        plugins = request.config.pluginmanager
        reporter = plugins.get_plugin("terminalreporter")
        capture = plugins.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line("")
                for line in _observed:
                    reporter.write_line(line)


@dataclass
class Job:
    kind: str
    key: str
    id: str

    @property
    def policy(self) -> str:
        return KINDS[self.kind][1]


def submit(proj: Any, kind: str, *args: Any, **options: Any) -> Job:
    key = unique(kind)
    task = getattr(proj, KINDS[kind][0])
    # keep the id only: a pending AsyncResult that outlives the session's Redis (held by a
    # failure's traceback) complains at exit
    return Job(kind, key, str(task.apply_async((key, *args), **options).id))


def result(proj: Any, job: Job) -> Any:
    return proj.app.AsyncResult(job.id).get(timeout=10)


def runs(r: redis.Redis, job: Job) -> list[tuple[int, str]]:
    """(attempt, worker) for each start of the job's body, (attempt, "done") for each end."""
    found = []
    for entry in r.lrange(job.key, 0, -1):
        attempt, *rest = entry.split(":")
        found.append((int(attempt), rest[-1]))
    return found


def starts(r: redis.Redis, job: Job) -> int:
    return sum(1 for _, where in runs(r, job) if where != "done")


def running(proj: Any, r: redis.Redis, worker: Any, *jobs: Job) -> None:
    """Wait until the body of every job runs on ``worker``."""
    for job in jobs:
        wait_state(proj.jobbers, job.id, S.STARTED, worker=worker)
        wait_for(lambda job=job: runs(r, job), message=f"the {job.kind} task's body to start")


def env_for(acks_late: bool, **extra: str) -> dict[str, str]:
    return {"PROJ_ACKS_LATE": "1" if acks_late else "0", **extra}


def shut(worker: Any, how: str, meanwhile: Callable[[], None] | None = None) -> float:
    """Signal ``worker`` ("sigterm"/"sigquit" to its main pid, "group": SIGTERM to its whole
    process group); wait until it exits (calling ``meanwhile`` while waiting); seconds."""
    began = time.monotonic()
    if how == "group":
        os.killpg(worker.proc.pid, signal.SIGTERM)
    else:
        worker.signal(signal.SIGQUIT if how == "sigquit" else signal.SIGTERM)

    def exited() -> bool:
        if meanwhile is not None:
            meanwhile()
        return worker.proc.poll() is not None

    wait_for(exited, timeout=30, message=f"{worker.name} to exit after {how}")
    took = time.monotonic() - began
    assert worker.proc.returncode == 0, worker.log[-5000:]
    return took


def broker(r: redis.Redis) -> Counter[str]:
    """Task ids of the messages the broker holds: queued, or delivered and not acknowledged."""
    ids: Counter[str] = Counter()
    for key in r.scan_iter("celery*"):
        if r.type(key) == "list":
            ids.update(json.loads(m)["headers"]["id"] for m in r.lrange(key, 0, -1))
    ids.update(json.loads(v)[0]["headers"]["id"] for v in r.hvals("unacked"))
    return ids


# ----------------------------------------------------------------------------- outcomes


def assert_stalled(proj: Any, r: redis.Redis, job: Job, worker: Any) -> None:
    record = wait_state(proj.jobbers, job.id, S.STALLED, timeout=5, worker=worker)
    assert path(proj.jobbers, job.id) == PUBLISH + START + [("started", "stalled")]
    [step] = transitions(proj.jobbers, job.id, S.STALLED)
    assert step.reason is not None
    assert step.reason.endswith("(on_shutdown=stop)"), step.reason
    assert (step.attempt, step.worker) == (1, worker.name)
    assert record.attempt == 1
    assert runs(r, job) == [(1, worker.name)]
    [entry] = dead_letters(proj.jobbers, job.id)  # proj.on_stop saves dead letters
    assert (entry.reason, entry.attempt, entry.worker) == ("stalled", 1, worker.name)


def assert_resubmitted(proj: Any, r: redis.Redis, job: Job, worker: Any,
                       retries: int = 0, timeout: float = 5) -> None:
    assert runs(r, job) == [(1, worker.name)]
    record = wait_state(proj.jobbers, job.id, S.SUBMITTED, timeout=timeout, worker=worker)
    assert path(proj.jobbers, job.id) == PUBLISH + START + [("started", "unsubmitted"),
                                                            *PUBLISH]
    step = transitions(proj.jobbers, job.id, S.UNSUBMITTED)[-1]
    assert step.reason is not None
    assert step.reason.endswith(f"(on_shutdown={job.policy}): resubmitted"), step.reason
    assert (step.attempt, step.worker) == (1, worker.name)
    assert (record.attempt, record.retry_attempt) == (1, retries)
    assert dead_letters(proj.jobbers, job.id) == []


def assert_completed(proj: Any, r: redis.Redis, job: Job, worker: Any) -> None:
    record = wait_state(proj.jobbers, job.id, S.COMPLETED, timeout=5, worker=worker)
    assert path(proj.jobbers, job.id) == PUBLISH + START + COMPLETE
    assert record.attempt == 1
    ended = [] if job.kind == "silent" else [(1, "done")]  # silent logs its start only
    assert runs(r, job) == [(1, worker.name), *ended]


def rerun(proj: Any, r: redis.Redis, worker_factory: Any, first: Any, jobs: list[Job],
          env: dict[str, str]) -> Any:
    """Start a second worker: each job runs exactly once more there, to completion. (A
    threads worker: it starts and stops faster than prefork, and nothing interrupts it.)"""
    second = worker_factory(pool="threads", concurrency=max(2, len(jobs)), env=env)
    for job in jobs:
        record = wait_state(proj.jobbers, job.id, S.COMPLETED, timeout=20, worker=second)
        assert record.attempt == 2
        assert runs(r, job)[0] == (1, first.name)
        assert runs(r, job)[-2:] == [(2, second.name), (2, "done")]
        assert result(proj, job) == ("done" if job.kind != "checkpoint" else 15)
    return second


def settle(r: redis.Redis, worker: Any) -> None:
    """Wait until the broker holds nothing (a duplicate delivery has been refused), then stop
    ``worker``: no message is left that could run anything again."""
    wait_for(lambda: not broker(r), timeout=15, message="the broker to hold no message")
    assert worker.stop() == 0


def observe(pool: str, how: str, acks_late: bool, took: float, proj: Any, r: redis.Redis,
            after: dict[str, str], jobs: list[Job]) -> None:
    """Keep one line for JOBBERS_SHUTDOWN_REPORT: state after the first worker exited, final
    state, and how many times each body started."""
    parts = [f"{job.kind}: {after[job.id]} -> {proj.jobbers.get(job.id).state.value}, "
             f"{starts(r, job)} start(s)" for job in jobs]
    _observed.append(f"{pool:8} {how:8} acks_late={int(acks_late)} shutdown {took:5.2f}s | "
                     + "; ".join(parts))


def states(proj: Any, jobs: list[Job]) -> dict[str, str]:
    return {job.id: proj.jobbers.get(job.id).state.value for job in jobs}


# ------------------------------------------------------------------------- prefork, warm


@pytest.mark.parametrize(
    ("kind", "acks_late"),
    [("stop", False), ("checkpoint", True), ("continue", False)],
    ids=["stop", "resubmit-acks_late", "continue"],
)
def test_prefork_sigterm_applies_the_policy(proj, worker_factory, r, kind, acks_late):
    env = env_for(acks_late)
    first = worker_factory(pool="prefork", concurrency=1, env=env)
    jobbers = proj.jobbers
    retries = 2  # a resubmission keeps the retry count
    if kind == "checkpoint":  # proj.on_resubmit_ckpt: 15 steps of 0.1 s, a checkpoint after each
        job = submit(proj, kind, 15, retries=retries)
    else:
        job = submit(proj, kind, LONG_S if kind == "stop" else 4.5, retries=retries)
    running(proj, r, first, job)
    if kind == "checkpoint":
        wait_for(lambda: jobbers.get(job.id).checkpoint, message="a first checkpoint")

    passes: list[tuple[float, Any]] = []

    def clean() -> None:  # cleaner passes while a continue task drains
        if not passes or time.monotonic() - passes[-1][0] >= 1.0:
            passes.append((time.monotonic(), jobbers.cleaner.run(by="test")))

    took = shut(first, "sigterm", meanwhile=clean if kind == "continue" else None)
    after = states(proj, [job])

    if kind == "stop":
        assert_stalled(proj, r, job, first)
        assert broker(r) == Counter()  # acknowledged: nothing can run it again
    elif kind == "continue":
        # The worker waited for it, longer than worker_lost_after: its heartbeats and the
        # worker's liveness went on, so no cleaner pass took it for stalled.
        assert_completed(proj, r, job, first)
        assert took > LOST_AFTER_S
        assert len(passes) >= 3
        assert [p.stalled for _, p in passes] == [0] * len(passes)
        assert broker(r) == Counter()
        assert result(proj, job) == "done"
    else:
        assert_resubmitted(proj, r, job, first, retries=retries)
        assert jobbers.get(job.id).checkpoint >= 1  # kept for the next attempt
        # the new message only: the interrupted one was acknowledged
        assert broker(r) == Counter({job.id: 1})
        second = rerun(proj, r, worker_factory, first, [job], env)
        record = jobbers.get(job.id)
        assert record.retry_attempt == retries
        # attempt 2 got the same retry count and the checkpoint, and resumed from it
        first_run, resumed = r.lrange(f"{job.key}:resume", 0, -1)
        assert first_run == f"1:{retries}:None"
        attempt, got_retries, ckpt = resumed.split(":")
        assert (attempt, got_retries) == ("2", str(retries))
        assert 1 <= int(ckpt) < 15
        assert record.checkpoint == 15
        settle(r, second)
        assert len(runs(r, job)) == 3
    observe("prefork", "sigterm", acks_late, took, proj, r, after, [job])


ACKS = pytest.mark.parametrize("acks_late", [False, True], ids=["early_ack", "acks_late"])


@ACKS
def test_prefork_sigterm_three_policies_at_once(proj, worker_factory, r, acks_late):
    env = env_for(acks_late)
    first = worker_factory(pool="prefork", concurrency=3, env=env)
    stop = submit(proj, "stop", LONG_S)
    resubmit = submit(proj, "resubmit", 1.0, retries=2)  # keeps its retry count
    cont = submit(proj, "continue", 1.5)
    jobs = [stop, resubmit, cont]
    running(proj, r, first, *jobs)

    took = shut(first, "sigterm")
    after = states(proj, jobs)

    assert_stalled(proj, r, stop, first)
    assert_resubmitted(proj, r, resubmit, first, retries=2)
    assert_completed(proj, r, cont, first)
    assert result(proj, cont) == "done"
    assert broker(r) == Counter({resubmit.id: 1})

    second = rerun(proj, r, worker_factory, first, [resubmit], env)
    assert proj.jobbers.get(resubmit.id).retry_attempt == 2
    settle(r, second)
    # nothing ran again meanwhile, and nothing can
    assert runs(r, stop) == [(1, first.name)]
    assert runs(r, cont) == [(1, first.name), (1, "done")]
    assert runs(r, resubmit) == [(1, first.name), (2, second.name), (2, "done")]
    assert proj.jobbers.get(stop.id).state is S.STALLED
    assert proj.jobbers.get(cont.id).state is S.COMPLETED
    observe("prefork", "sigterm", acks_late, took, proj, r, after, jobs)


# ------------------------------------------------------------------------ threads, solo


@pytest.mark.parametrize(
    ("pool", "kinds"),
    [("threads", ("stop", "continue", "silent")), ("solo", ("stop",)),
     ("solo", ("resubmit",)), ("solo", ("continue",)), ("solo", ("silent",))],
    ids=["threads", "solo-stop", "solo-resubmit", "solo-continue", "solo-silent"],
)
def test_cooperative_pools_apply_the_policy_at_the_next_heartbeat(
        proj, worker_factory, r, pool, kinds):
    first = worker_factory(pool=pool, concurrency=len(kinds))
    seconds = {"stop": LONG_S, "resubmit": 1.0, "continue": 1.5, "silent": 1.5}
    jobs = [submit(proj, kind, seconds[kind]) for kind in kinds]
    running(proj, r, first, *jobs)

    took = shut(first, "sigterm")
    after = states(proj, jobs)

    resubmitted = []
    for job in jobs:
        if job.kind == "stop":
            assert_stalled(proj, r, job, first)
        elif job.kind == "resubmit":
            assert_resubmitted(proj, r, job, first)
            resubmitted.append(job)
        else:  # continue, and a task that never heartbeats: the worker waits for it
            assert_completed(proj, r, job, first)
    assert broker(r) == Counter(job.id for job in resubmitted)
    if resubmitted:
        second = rerun(proj, r, worker_factory, first, resubmitted, {})
        settle(r, second)
    for job in jobs:
        assert starts(r, job) == (2 if job in resubmitted else 1)
    observe(pool, "sigterm", False, took, proj, r, after, jobs)


def test_threads_resubmit_runs_once_more_on_another_worker(proj, worker_factory, r):
    first = worker_factory(pool="threads", concurrency=2)
    job = submit(proj, "resubmit", 1.0)
    running(proj, r, first, job)

    shut(first, "sigterm")

    assert runs(r, job) == [(1, first.name)]  # fails: [(1, first), (2, first)]
    assert_resubmitted(proj, r, job, first)
    second = rerun(proj, r, worker_factory, first, [job], {})
    settle(r, second)


# --------------------------------------------------------------------------- prefork, cold


@pytest.mark.parametrize(
    ("how", "acks_late"), [("sigquit", False), ("remap", True)],
    ids=["sigquit-early_ack", "remap_sigterm-acks_late"],
)
def test_prefork_cold_shutdown(proj, worker_factory, r, how, acks_late):
    """SIGQUIT, or SIGTERM with REMAP_SIGTERM=SIGQUIT, and worker_soft_shutdown_timeout: the
    tasks run on for the soft timeout; those still running are then interrupted whatever
    their policy: stop -> stalled, resubmit and continue -> resubmitted."""
    extra = {"PROJ_SOFT_SHUTDOWN": str(SOFT_SHUTDOWN_S)}
    if how == "remap":
        extra["REMAP_SIGTERM"] = "SIGQUIT"
    env = env_for(acks_late, **extra)
    first = worker_factory(pool="prefork", concurrency=4, env=env)
    stop = submit(proj, "stop", LONG_S)
    resubmit = submit(proj, "resubmit", 2.5)
    cont = submit(proj, "continue", 2.5)  # still running when the soft timeout ends
    short = submit(proj, "continue", 0.5)  # ends within the soft timeout
    jobs = [stop, resubmit, cont, short]
    running(proj, r, first, *jobs)

    took = shut(first, "sigquit" if how == "sigquit" else "sigterm")
    after = states(proj, jobs)

    assert took >= SOFT_SHUTDOWN_S
    assert_stalled(proj, r, stop, first)
    assert_resubmitted(proj, r, resubmit, first)
    assert_resubmitted(proj, r, cont, first)  # interrupted by force: resubmitted, not lost
    assert_completed(proj, r, short, first)
    assert broker(r) == Counter({resubmit.id: 1, cont.id: 1})

    second = rerun(proj, r, worker_factory, first, [resubmit, cont], env)
    settle(r, second)
    assert [starts(r, job) for job in jobs] == [1, 2, 2, 1]
    assert proj.jobbers.get(stop.id).state is S.STALLED
    observe("prefork", how, acks_late, took, proj, r, after, jobs)


# ------------------------------------------------------------------- whole process group


@ACKS
def test_prefork_sigterm_to_the_process_group(proj, worker_factory, r, acks_late):
    """systemd's default KillMode, ``kill -TERM -<pgid>``: the children are interrupted at
    once, whatever their policy; each task still records what happened."""
    env = env_for(acks_late)
    first = worker_factory(pool="prefork", concurrency=3, env=env)
    stop = submit(proj, "stop", LONG_S)
    resubmit = submit(proj, "resubmit", 1.5)
    cont = submit(proj, "continue", 1.5)
    jobs = [stop, resubmit, cont]
    running(proj, r, first, *jobs)

    took = shut(first, "group")
    after = states(proj, jobs)

    held = broker(r)
    hit = [f"{job.kind}: {after[job.id]}, {held[job.id]} message(s)" for job in jobs
           if after[job.id] in ("started", "unsubmitted")
           or (job is not stop and after[job.id] == "submitted" and not held[job.id])
           or (job is stop and not dead_letters(proj.jobbers, job.id))]
    # a second SIGTERM (ShutdownStep.close()) while a child applies its policy is held back
    # until the policy is recorded: nothing is left started or unsubmitted, nothing lost
    assert not hit, hit
    assert_stalled(proj, r, stop, first)
    assert_resubmitted(proj, r, resubmit, first)
    assert_resubmitted(proj, r, cont, first)  # interrupted by force: resubmitted, not lost
    assert held[resubmit.id] >= 1  # its new message
    assert held[cont.id] >= 1
    if not acks_late:
        assert held == Counter({resubmit.id: 1, cont.id: 1})
    # with acks_late the interrupted messages may be restored too: they are refused

    second = rerun(proj, r, worker_factory, first, [resubmit, cont], env)
    settle(r, second)
    assert [starts(r, job) for job in jobs] == [1, 2, 2]
    assert proj.jobbers.get(stop.id).state is S.STALLED
    observe("prefork", "group", acks_late, took, proj, r, after, jobs)


def test_process_group_sigterm_during_a_slow_publish(proj, worker_factory, r):
    # proj.on_resubmit_slow takes 1.5 s to publish its resubmission (a slow broker): the
    # signal ShutdownStep.close() sends the child lands during that publish.
    first = worker_factory(pool="prefork", concurrency=1, env={"PROJ_SLOW_PUBLISH": "1.5"})
    job = submit(proj, "slow", 1.0)
    running(proj, r, first, job)

    shut(first, "group")

    assert_resubmitted(proj, r, job, first, timeout=1)
    assert broker(r) == Counter({job.id: 1})


def test_prefork_policy_in_a_child_that_was_interrupted_before(proj, worker_factory, r):
    # One pool child: cancel(terminate=True) interrupts a first task in it (SystemExit, the
    # cancellation is honoured and the child stays in the pool), then it runs a resubmit
    # task when the worker shuts down.
    first = worker_factory(pool="prefork", concurrency=1)
    key = unique("cancelled")
    cancelled = proj.until_released.delay(key, False)  # never heartbeats
    wait_state(proj.jobbers, cancelled.id, S.STARTED, worker=first)
    wait_for(lambda: r.lrange(key, 0, -1), message="the first task's body")
    assert proj.jobbers.cancel(cancelled.id, terminate=True) is True
    wait_state(proj.jobbers, cancelled.id, S.CANCELLED, timeout=15, worker=first)
    assert proj.jobbers.history(cancelled.id)[-1].reason == (
        "cancellation honoured: interrupted by its worker")  # the child unwound and lives on
    del cancelled
    job = submit(proj, "resubmit", 1.0)
    running(proj, r, first, job)

    shut(first, "sigterm")

    assert_resubmitted(proj, r, job, first, timeout=1)  # fails: the record is started
