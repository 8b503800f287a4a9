"""Resubmitting a dead letter as the current version (issue 14, point 7): after the task's
``version`` was bumped, a worker running the new version drops the entry's old version
again, and runs it only when the resubmit asks for the current version."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobbers_celery import ResubmitVersion, TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import dead_letters, transitions, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState


def test_resubmit_runs_the_entry_as_the_current_version_only_when_asked(
        proj: Any, worker_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=1, env={"PROJ_VERSION": "2"})
    result = proj.versioned.delay()  # published as version 1 by this process
    wait_state(jobbers, result.id, S.DROPPED, worker=worker)
    [entry] = wait_for(lambda: dead_letters(jobbers, result.id), timeout=10,
                       message="the dead letter")
    assert entry.version == 1

    # by default the entry keeps its version: the version-2 worker drops it again
    assert jobbers.resubmit_dead_letters([entry]) == [result.id]
    wait_for(lambda: len(transitions(jobbers, result.id, S.DROPPED)) == 2, timeout=20,
             message="the second drop")
    record = jobbers.get(result.id)
    assert (record.state, record.version) == (S.DROPPED, 1)

    # "current" = the version this process registers: still 1 here, so nothing changes...
    assert jobbers.current_versions(["proj.versioned"]) == {"proj.versioned": 1}
    # ...until this process runs the new code too (a deploy): then it is 2
    task_cls = type(proj.app.tasks["proj.versioned"])
    monkeypatch.setattr(task_cls, "version", 2)
    monkeypatch.setattr(task_cls, "jobbers_options",
                        dataclasses.replace(task_cls.jobbers_options, version=2))
    # a name not registered here has no current version: refused before anything changes
    with pytest.raises(ValueError, match=r"proj\.not_here is not registered as a JobbersTask"):
        jobbers.resubmit_dead_letters(
            [entry, dataclasses.replace(entry, task_id="other", name="proj.not_here")],
            version="current")
    assert jobbers.get(result.id).state == S.DROPPED
    assert jobbers.get("other") is None

    assert jobbers.resubmit_dead_letters([entry], version=ResubmitVersion.CURRENT) == [
        result.id]
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert record.version == 2
    assert proj.app.AsyncResult(result.id).get(timeout=20) == 2  # the v2 body ran
    resubmitted = transitions(jobbers, result.id, S.SUBMITTED)[-1]
    assert resubmitted.reason == ("resubmitted (retry count reset) from the dead-letter queue "
                                  "as the current version 2 (the entry's was 1)")


def test_resubmit_of_records_as_the_current_version(proj: Any, worker_factory: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``jobbers.resubmit`` (from the record's own payload: a cancelled task has no dead
    letter) takes the same choice."""
    jobbers = proj.jobbers
    result = proj.versioned.delay()
    assert jobbers.cancel(result.id)
    unknown = proj.app.send_task("proj.does_not_exist")  # no process registers it
    with pytest.raises(ValueError, match=r"proj\.does_not_exist is not registered"):
        jobbers.resubmit([result.id, unknown.id], version="current")
    assert jobbers.get(result.id).state == S.CANCELLED  # refused before anything changed
    task_cls = type(proj.app.tasks["proj.versioned"])
    monkeypatch.setattr(task_cls, "jobbers_options",
                        dataclasses.replace(task_cls.jobbers_options, version=2))
    proj.app.control.purge()  # the cancelled message (version 1) never reaches a worker
    assert jobbers.resubmit([result.id], version="current") == [result.id]
    worker = worker_factory(pool="threads", concurrency=1, env={"PROJ_VERSION": "2"})
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert record.version == 2
    assert transitions(jobbers, result.id, S.SUBMITTED)[-1].reason == (
        "resubmitted (retry count reset) as the current version 2")
