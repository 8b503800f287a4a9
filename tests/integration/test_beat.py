"""celery beat publishes through the same path: every beat-sent task is recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from jobbers_celery import TaskState
from tests.conftest import ROOT, subprocess_env, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def test_tasks_sent_by_celery_beat_are_recorded_and_run(proj, worker_factory, tmp_path):
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.beat_proj", "beat",
         "-s", str(tmp_path / "schedule"), "--pidfile", str(tmp_path / "beat.pid"),
         "-l", "INFO"],
        cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        # No worker yet: what beat sent waits in the queue, recorded as submitted.
        waiting = wait_for(lambda: proj.jobbers.tasks(state=TaskState.SUBMITTED, name="proj.add"),
                           timeout=20, message="a beat-sent task recorded as submitted")
        first = waiting[-1]
        assert first.queue == "celery"
        assert first.version == 1
        worker_factory(pool="threads", concurrency=2)
        done = wait_for(
            lambda: (r := proj.jobbers.get(first.task_id)) and r.state == TaskState.COMPLETED
            and r, timeout=20, message="the beat-sent task to complete")
        assert done.attempt == 1
        assert [t.to_state for t in proj.jobbers.history(first.task_id)] == [
            TaskState.SUBMITTED, TaskState.STARTED, TaskState.COMPLETED]
    finally:
        beat.send_signal(signal.SIGTERM)
        try:
            beat.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(beat.pid, signal.SIGKILL)
            beat.wait(5)
