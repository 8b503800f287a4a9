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

import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration import shutdown_cases
from tests.integration.lifecycle_helpers import unique, wait_state
from tests.integration.shutdown_cases import (
    CKPT_STEPS,
    INTERRUPTED_S,
    LONG_S,
    LOST_AFTER_S,
    assert_completed,
    assert_resubmitted,
    assert_stalled,
    broker,
    env_for,
    observe,
    observed,
    rerun,
    result,
    running,
    runs,
    settle,
    shut,
    states,
    submit,
)

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if os.environ.get("JOBBERS_SHUTDOWN_REPORT") and observed:
        plugins = request.config.pluginmanager
        reporter = plugins.get_plugin("terminalreporter")
        capture = plugins.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line("")
                for line in observed:
                    reporter.write_line(line)


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
    if kind == "checkpoint":  # proj.on_resubmit_ckpt: steps of 0.1 s, a checkpoint after each
        job = submit(proj, kind, CKPT_STEPS, retries=retries)
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
        assert 1 <= int(ckpt) < CKPT_STEPS
        assert record.checkpoint == CKPT_STEPS
        settle(r, second)
        assert len(runs(r, job)) == 3
    observe("prefork", "sigterm", acks_late, took, proj, r, after, [job])


ACKS = pytest.mark.parametrize("acks_late", [False, True], ids=["early_ack", "acks_late"])


@ACKS
def test_prefork_sigterm_three_policies_at_once(proj, worker_factory, r, acks_late):
    shutdown_cases.prefork_sigterm_three_policies_at_once(proj, worker_factory, r, acks_late)


# ------------------------------------------------------------------------ threads, solo


@pytest.mark.parametrize(
    ("pool", "kinds"),
    [("threads", ("stop", "continue", "silent")), ("solo", ("stop",)),
     ("solo", ("resubmit",)), ("solo", ("continue",)), ("solo", ("silent",))],
    ids=["threads", "solo-stop", "solo-resubmit", "solo-continue", "solo-silent"],
)
def test_cooperative_pools_apply_the_policy_at_the_next_heartbeat(
        proj, worker_factory, r, pool, kinds):
    shutdown_cases.cooperative_pools_apply_the_policy_at_the_next_heartbeat(proj, worker_factory, r, pool, kinds)


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
    shutdown_cases.prefork_cold_shutdown(proj, worker_factory, r, how, acks_late)


# ------------------------------------------------------------------- whole process group


@ACKS
def test_prefork_sigterm_to_the_process_group(proj, worker_factory, r, acks_late):
    shutdown_cases.prefork_sigterm_to_the_process_group(proj, worker_factory, r, acks_late)


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
    job = submit(proj, "resubmit", INTERRUPTED_S)  # still running when the loop wakes
    running(proj, r, first, job)

    shut(first, "sigterm")

    assert_resubmitted(proj, r, job, first, timeout=1)  # fails: the record is started
