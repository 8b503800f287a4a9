"""The beat watch under django-celery-beat's ``DatabaseScheduler`` (real beat and worker
subprocesses of ``tests/integration/dcb_proj.py``, its sqlite database): a schedule added
as a ``PeriodicTask`` row is learned with the one ``install()`` put in ``beat_schedule``;
their runs carry django-celery-beat's own ``periodic_task_name`` header and are recorded
from publish to end; a row disabled is marked removed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, wait_for
from tests.integration.test_beat_django import (  # noqa: F401 - fixtures
    _django_env,
    _start_beat,
    celery_proc,
    dcb_db,
    migrated_db,
)

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def _django(db: Path, code: str) -> None:
    done = subprocess.run([sys.executable, "-m", "django", "shell", "-c", code], cwd=ROOT,
                          env=_django_env(db), capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


ADD = """
from django_celery_beat.models import IntervalSchedule, PeriodicTask
every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
PeriodicTask.objects.create(name="db tick <b>", task="jobbers.clean", interval=every)
"""
DISABLE = """
from django_celery_beat.models import PeriodicTask, PeriodicTasks
PeriodicTask.objects.filter(name="db tick <b>").update(enabled=False)
PeriodicTasks.update_changed()
"""


def test_database_scheduler_rows_are_learned_and_their_runs_recorded(
        proj, celery_proc, dcb_db, tmp_path):  # noqa: F811 - the imported fixtures
    _django(dcb_db, ADD)
    beat = _start_beat(celery_proc, tmp_path)
    worker = celery_proc("worker", "worker", "-P", "threads", "-c", "2",
                         "-n", "dcbp@localhost", "--without-mingle", "--without-gossip",
                         "--without-heartbeat")

    def recorded() -> Any:
        beat.alive()
        worker.alive()
        found = {s.name: s for s in proj.jobbers.periodic_tasks(runs=20)}
        row = found.get("db tick <b>")
        ended = [r for r in row.runs if r.ended_at] if row is not None else []
        return len(ended) >= 2 and "jobbers.clean" in found and found

    found = wait_for(recorded, timeout=40, interval=0.2,
                     message="the database row's schedule learned and two runs ended")
    row = found["db tick <b>"]
    assert (row.source, row.task, row.period_ms) == ("beat", "jobbers.clean", 1000)
    assert row.removed_at is None
    run = next(r for r in row.runs if r.ended_at)
    assert run.slot_at is not None
    assert run.published_at is not None
    assert run.started_at is not None
    assert run.state == "SUCCESS"
    assert found["jobbers.clean"].source == "beat"

    _django(dcb_db, DISABLE)
    wait_for(lambda: beat.alive() and {s.name: s for s in proj.jobbers.periodic_tasks(runs=0)
                                       }["db tick <b>"].removed_at is not None,
             timeout=30, interval=0.2, message="the disabled row marked removed")
