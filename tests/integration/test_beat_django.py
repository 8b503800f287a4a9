"""The cleaner's beat entry under django-celery-beat's ``DatabaseScheduler``.

Everything Django runs in subprocesses (``tests/integration/dcb_proj.py`` with
``tests/integration/dcb_settings.py``): ``DJANGO_SETTINGS_MODULE`` is never set in the
pytest process, so Celery apps created here get no Django fixup. The test reads the
scheduler's sqlite database with :mod:`sqlite3` and the cleaner's status through
``tests.integration.proj`` (same Redis, same key prefix).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

APP = "tests.integration.dcb_proj"
SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CLEANER = "jobbers.clean"


def _django_env(db: Path) -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.integration.dcb_settings",
            "JOBBERS_DCB_DB": str(db)}


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sqlite database with django-celery-beat's tables, migrated once for the module."""
    db = tmp_path_factory.mktemp("dcb") / "template.sqlite3"
    done = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT, env=_django_env(db), capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"migrate failed:\n{done.stdout}\n{done.stderr}"
    return db


@pytest.fixture
def dcb_db(migrated_db: Path, tmp_path: Path) -> Path:
    """A fresh copy of the migrated database for one test."""
    db = tmp_path / "dcb.sqlite3"
    shutil.copyfile(migrated_db, db)
    return db


class Proc:
    def __init__(self, proc: subprocess.Popen[str], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.log_path.stem} exited early "
                                 f"({self.proc.returncode}):\n{self.log}")
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


@pytest.fixture
def celery_proc(redis_url: str, dcb_db: Path, tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start ``celery -A tests.integration.dcb_proj <args>``; stopped at teardown."""
    procs: list[Proc] = []

    def start(label: str, *args: str) -> Proc:
        log_path = tmp_path / f"{label}.log"
        with log_path.open("w") as log_file:  # the child keeps its own descriptor
            popen = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", APP, *args, "-l", "INFO"],
                cwd=ROOT, env=_django_env(dcb_db), stdout=log_file,
                stderr=subprocess.STDOUT, text=True, start_new_session=True,
            )
        proc = Proc(popen, log_path)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()


def _start_beat(celery_proc: Callable[..., Proc], tmp_path: Path) -> Proc:
    return celery_proc("beat", "beat", "-S", SCHEDULER, "--pidfile", str(tmp_path / "beat.pid"))


def _cleaner_row(db: Path) -> dict[str, Any] | None:
    """The ``jobbers.clean`` PeriodicTask row joined with its IntervalSchedule."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True,
                                                timeout=5)) as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute(
                "SELECT t.task, t.enabled, t.expires, t.expire_seconds, t.one_off, "
                "i.every, i.period FROM django_celery_beat_periodictask t "
                "LEFT JOIN django_celery_beat_intervalschedule i ON i.id = t.interval_id "
                "WHERE t.name = ?", (CLEANER,)).fetchone()
    except sqlite3.OperationalError:  # locked by a beat write: try again
        return None
    return dict(row) if row is not None else None


def test_database_scheduler_runs_the_cleaner_every_interval(proj, celery_proc, dcb_db,
                                                            tmp_path):
    beat = _start_beat(celery_proc, tmp_path)
    worker = celery_proc("worker", "worker", "-P", "threads", "-c", "2",
                         "-n", "dcb@localhost", "--without-mingle", "--without-gossip",
                         "--without-heartbeat")

    # beat copied the entry install() put in beat_schedule into its tables
    row = wait_for(lambda: beat.alive() and _cleaner_row(dcb_db), timeout=20, interval=0.1,
                   message="the jobbers.clean PeriodicTask row")
    assert row["task"] == CLEANER
    assert row["enabled"] == 1
    assert row["one_off"] == 0
    assert (row["every"], row["period"]) == (1, "seconds")
    assert row["expires"] is None  # an absolute end date would disable the entry

    # and runs it: passes recorded by "beat", one interval apart
    seen: set[datetime] = set()

    def two_beat_passes() -> bool:
        beat.alive()
        worker.alive()
        status = proj.jobbers.cleaner_status()
        if status.by == "beat" and status.last_run_at is not None:
            seen.add(status.last_run_at)
        return len(seen) >= 2

    wait_for(two_beat_passes, timeout=20, interval=0.1,
             message="two cleaner passes by beat under the DatabaseScheduler")
    first, second = sorted(seen)[:2]
    assert second > first
    status = proj.jobbers.cleaner_status()
    assert status.by == "beat"
    assert not status.overdue
    assert status.last_report is not None
    assert status.last_report["by"] == "beat"


def _queued_cleaner_messages(client: Any) -> list[dict[str, Any]]:
    messages = [json.loads(raw) for raw in client.lrange("celery", 0, -1)]
    return [m for m in messages if m.get("headers", {}).get("task") == CLEANER]


def test_database_scheduler_sends_cleaner_messages_that_expire(redis_server, celery_proc,
                                                               dcb_db, tmp_path):
    import redis

    client = redis.Redis.from_url(redis_server.url())
    try:
        beat = _start_beat(celery_proc, tmp_path)
        # no worker: what beat sends stays in the queue, where its headers can be read
        message = wait_for(lambda: beat.alive() and _queued_cleaner_messages(client),
                           timeout=20, interval=0.1,
                           message="a jobbers.clean message sent by beat")[0]
        assert message["headers"].get("expires") is not None, (
            f"beat sent jobbers.clean without an expiry; row: {_cleaner_row(dcb_db)}")
    finally:
        client.close()
