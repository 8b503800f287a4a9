"""The history with real workers: tasks run by a prefork worker (tests.integration.proj, the
sharded layout) are counted in the series of their name, their queue and the total
(completed, failed, retried), with a runtime that matches what they slept and a queue
latency that shows a backlog; ``celery jobbers history`` prints the same series (human and
``--json``) and exits 2 on a range it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from jobbers_celery import TaskState
from jobbers_celery.core.series import MinuteCounts
from tests.conftest import ROOT, Worker, subprocess_env
from tests.integration.lifecycle_helpers import wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState


def _total(proj: Any, **which: str) -> MinuteCounts:
    read = proj.jobbers.series(since=proj.jobbers.now() - timedelta(minutes=10), **which)
    return sum((p.counts for p in read.points), MinuteCounts())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "jobbers", "history",
         *args], cwd=ROOT, env=subprocess_env({"NO_COLOR": "1", "COLUMNS": "120"}), input="",
        capture_output=True, text=True, timeout=60, check=False)


def test_series_count_what_real_workers_ran(proj: Any,
                                            worker_factory: Callable[..., Worker]) -> None:
    worker_factory(concurrency=2)
    sleepy = [proj.sleepy.delay(0.3) for _ in range(4)]
    adds = [proj.add.delay(i, i) for i in range(20)]
    booms = [proj.boom.delay() for _ in range(3)]
    flaky = proj.flaky.delay(1)  # fails once (an expected exception), then completes
    for res in (*sleepy, *adds):
        wait_state(proj.jobbers, res.id, S.COMPLETED)
    for res in booms:
        wait_state(proj.jobbers, res.id, S.FAILED)
    wait_state(proj.jobbers, flaky.id, S.COMPLETED)

    # each step added to its minute in its own script: the counts are there with the states
    every = _total(proj)
    assert (every.completed, every.failed, every.retried) == (25, 3, 1)
    assert every.started == 29
    assert every.ended == 29

    sleeps = _total(proj, name="proj.sleepy")
    assert (sleeps.completed, sleeps.failed, sleeps.started) == (4, 0, 4)
    mean_runtime = sleeps.runtime_ms / sleeps.ended
    assert 300 <= mean_runtime < 3000, mean_runtime  # it slept 0.3 s each
    assert _total(proj, name="proj.boom").failed == 3
    assert _total(proj, name="proj.flaky").retried == 1
    # 4 sleeps of 0.3 s on 2 processes held the 20 adds back: they waited in the queue
    adds_total = _total(proj, name="proj.add")
    assert adds_total.completed == 20
    assert adds_total.latency_ms / adds_total.started > 50
    assert _total(proj, queue="celery").completed == 25
    names, queues = proj.jobbers.series_names()
    assert {"proj.add", "proj.sleepy", "proj.boom", "proj.flaky"} <= set(names)
    assert queues == ["celery"]

    # the CLI prints the same series
    run = _cli("--name", "proj.add", "--since", "10m", "--json")
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    assert sum(p["completed"] for p in shown["points"]) == 20
    assert shown["name"] == "proj.add"
    assert shown["step_minutes"] == 1
    human = _cli("--name", "proj.boom", "--since", "10m")
    assert human.returncode == 0, human.stderr
    assert "task proj.boom" in human.stdout
    assert "3 (0 completed, 3 failed, 100.0% failed)" in human.stdout
    listed = _cli("--names", "--json")
    assert "proj.sleepy" in json.loads(listed.stdout)["names"]


@pytest.mark.parametrize(("args", "message"), [
    (["--since", "7w"], "not a span"),
    (["--since", "30d", "--step", "1"], "points"),
    (["--name", "a", "--queue", "b"], "not both"),
    (["--since", "1h", "--until", "2h"], "since must be before until"),
])
def test_cli_refuses_bad_ranges_with_exit_2(redis_url: str, args: list[str],
                                            message: str) -> None:
    run = _cli(*args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr
