"""End to end: failures that only the worker's main process sees (a lost pool child)."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from pathlib import Path

import pytest

from jobbers_celery import TaskState
from jobbers_celery.lifecycle.scheduler import Scheduler
from jobbers_celery.worker.runtime import scheduler_thread
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import (
    FAIL,
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


def children(pid: int) -> set[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    found: set[int] = set()
    for task_dir in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(c) for c in (task_dir / "children").read_text().split())
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return found


def pool_pid_running(proj, worker, task_id: str) -> int:
    """The pid of the pool child running ``task_id``, as the worker reports it."""

    def lookup() -> int | None:
        active = proj.app.control.inspect(destination=[worker.name], timeout=1).active() or {}
        for request in active.get(worker.name, []):
            if request["id"] == task_id and request.get("worker_pid"):
                return int(request["worker_pid"])
        return None

    return wait_for(lookup, timeout=10, interval=0.1, message=f"{task_id} in inspect().active()")


def test_lost_pool_child_fails_the_task_from_the_main_process(proj, worker_factory):
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=2)
    key = unique("pid")
    saving = proj.sleepy_save.delay(60, key)   # dead_letter_policy=save
    plain = proj.sleepy.delay(60)              # dead_letter_policy=none
    wait_state(jobbers, saving.id, S.STARTED, worker=worker)
    wait_state(jobbers, plain.id, S.STARTED, worker=worker)

    pool = children(worker.proc.pid)
    saving_pid = pool_pid_running(proj, worker, saving.id)
    plain_pid = pool_pid_running(proj, worker, plain.id)
    # The task body saw the same process the worker reports, and it is a pool child.
    assert int(wait_for(lambda: jobbers.store.client.get(key), message="pid")) == saving_pid
    assert {saving_pid, plain_pid} <= pool
    assert saving_pid != plain_pid
    assert worker.proc.pid not in (saving_pid, plain_pid)

    os.kill(saving_pid, signal.SIGKILL)
    os.kill(plain_pid, signal.SIGKILL)

    for result in (saving, plain):
        record = wait_state(jobbers, result.id, S.FAILED, timeout=20, worker=worker)
        assert path(jobbers, result.id) == PUBLISH + START + FAIL
        assert record.attempt == 1
        assert record.error is not None
        assert record.error.type == "billiard.exceptions.WorkerLostError"
        assert "signal 9" in record.error.message
        failed = transitions(jobbers, result.id, S.FAILED)[0]
        assert failed.reason == "WorkerLostError reported by the worker"
        assert failed.at == record.completed_at

    [entry] = wait_for(lambda: dead_letters(jobbers, saving.id), timeout=5,
                       message="dead letter of the lost task")
    assert entry.reason == "failed"
    assert entry.name == "proj.sleepy_save"
    assert entry.args == [60, key]
    assert entry.kwargs == {}
    assert entry.exception_type == "billiard.exceptions.WorkerLostError"
    assert entry.attempt == 1
    assert entry.worker == worker.name
    assert dead_letters(jobbers, plain.id) == []

    # The pool replaced its children and the worker goes on.
    assert proj.add.delay(3, 4).get(timeout=20) == 7
    assert worker.proc.poll() is None

    # A task lost with its child is resubmittable: it starts again, as attempt 2.
    jobbers.store.client.delete(key)
    assert jobbers.resubmit([saving.id]) == [saving.id]
    record = wait_state(jobbers, saving.id, S.STARTED, worker=worker)
    assert record.attempt == 2
    assert path(jobbers, saving.id)[-2:] == [(S.FAILED.value, S.SUBMITTED.value),
                                             (S.SUBMITTED.value, S.STARTED.value)]
    new_pid = int(wait_for(lambda: jobbers.store.client.get(key), message="new pid"))
    assert new_pid in children(worker.proc.pid)
    assert new_pid != saving_pid


# --------------------------------------------------------------------------- forks and threads
# The scheduler thread runs in the worker's main process. A prefork child forked while that
# thread held a lock (a redis-py pool lock, a module import lock during a first connect)
# inherited it locked and hung on its first task, which was then lost: the task was accepted
# (acked) but never started. Seen as ~2% of prefork worker starts under CPU load.


@pytest.mark.parametrize("hash_seed", ["0", "2"])
def test_scheduler_starts_after_the_pool_has_forked(proj, worker_factory, hash_seed):
    # Without an explicit dependency the boot order follows set iteration: with these seeds
    # the scheduler used to start (and talk to Redis) before the pool forked its children.
    worker = worker_factory(pool="prefork", concurrency=2,
                            env={"PYTHONHASHSEED": hash_seed}, extra=["-l", "DEBUG"])
    lines = worker.log.splitlines()

    def position(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    assert position("Worker: Starting Pool") < position("Worker: Starting jobbers scheduler")
    assert proj.add.delay(1, 2).get(timeout=20) == 3


def test_a_fork_waits_for_the_running_scheduler_pass(proj):
    # Pool children are also forked later (a lost child, max_tasks_per_child): a fork must
    # wait for the scheduler's current pass, so the child inherits no lock it holds.
    held = threading.Lock()  # stands for whatever the pass holds (pool lock, import lock)
    entered, release = threading.Event(), threading.Event()

    class SlowPass(Scheduler):
        def run_once(self) -> tuple[int, float | None]:
            with held:
                entered.set()
                release.wait(10)
            return 0, None

        def housekeeping(self) -> int:
            return 0

    jobbers = proj.jobbers
    scheduler = scheduler_thread(SlowPass(jobbers.store, jobbers.config, jobbers.publisher,
                                          worker_name="test"))
    scheduler.start()  # the fork hook is registered when the first such thread starts
    try:
        assert entered.wait(5)
        timer = threading.Timer(0.3, release.set)
        started = time.monotonic()  # before the timer: the pass ends 0.3 s after it, at least
        timer.start()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, 3.12+
            pid = os.fork()
        if pid == 0:  # the child: exit at once, 0 if the lock is free here
            os._exit(0 if held.acquire(timeout=2) else 1)
        waited = time.monotonic() - started
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child inherited a held lock"
        assert release.is_set()
        assert waited >= 0.2
    finally:
        release.set()
        scheduler.stop()
