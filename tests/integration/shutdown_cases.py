"""The ``on_shutdown`` cases run on two brokers, and the helpers of the shutdown tests.

test_shutdown.py (Redis broker) and test_on_rabbitmq.py (RabbitMQ) call the cases with the same
arguments. :func:`broker` reads what a Redis broker holds; test_on_rabbitmq.py replaces this
module's ``broker`` with one that reads its RabbitMQ vhost, so every helper here (``settle``
too) looks at the broker in use. ``observed`` collects the lines of
``JOBBERS_SHUTDOWN_REPORT`` (printed by test_shutdown.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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

S = TaskState

LOST_AFTER_S = 3.0  # proj: jobbers_worker_lost_after
SOFT_SHUTDOWN_S = 1.0  # PROJ_SOFT_SHUTDOWN for the cold shutdowns
LONG_S = 10.0  # a stop task: never reaches its end here
#: A prefork worker notices SIGTERM when its event loop next wakes, up to WAKE_UP_S (1 s)
#: after the signal (a Redis broker's BRPOP wakes it every second too), and only then
#: interrupts the ``stop`` and ``resubmit`` tasks. A task that must still be running then
#: lasts INTERRUPTED_S: well past that second plus the test's own delay between seeing the
#: body start and signalling (a 1 s body ended first, now and then, on a loaded machine).
INTERRUPTED_S = 3.0
CKPT_STEPS = 30  # proj.on_resubmit_ckpt's steps of 0.1 s: as long as INTERRUPTED_S

#: kind -> (proj task, its on_shutdown)
KINDS = {
    "stop": ("on_stop", "stop"),
    "resubmit": ("on_resubmit", "resubmit"),
    "continue": ("on_continue", "continue"),
    "silent": ("silent", "stop"),  # never heartbeats
    "checkpoint": ("on_resubmit_ckpt", "resubmit"),  # checkpoints every step
    "slow": ("on_resubmit_slow", "resubmit"),  # publishes its resubmission slowly
}

observed: list[str] = []


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
    """Task ids of the messages the broker holds: queued, or delivered and not acknowledged.

    Reads the Redis broker's lists; test_on_rabbitmq.py replaces it (module attribute)."""
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
        assert result(proj, job) == ("done" if job.kind != "checkpoint" else CKPT_STEPS)
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
    observed.append(f"{pool:8} {how:8} acks_late={int(acks_late)} shutdown {took:5.2f}s | "
                     + "; ".join(parts))


def states(proj: Any, jobs: list[Job]) -> dict[str, str]:
    return {job.id: proj.jobbers.get(job.id).state.value for job in jobs}


# ------------------------------------------------------------------------------- cases


def prefork_sigterm_three_policies_at_once(proj, worker_factory, r, acks_late):
    env = env_for(acks_late)
    first = worker_factory(pool="prefork", concurrency=3, env=env)
    stop = submit(proj, "stop", LONG_S)
    # still running when the worker's loop wakes and interrupts it; keeps its retry count
    resubmit = submit(proj, "resubmit", INTERRUPTED_S, retries=2)
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


def prefork_cold_shutdown(proj, worker_factory, r, how, acks_late):
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


def prefork_sigterm_to_the_process_group(proj, worker_factory, r, acks_late):
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


def cooperative_pools_apply_the_policy_at_the_next_heartbeat(
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
