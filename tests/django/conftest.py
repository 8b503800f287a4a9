"""Fixtures of the jobbers_django tests: PostgreSQL (pytest-django's test database), the
session's private Redis, the Django-sink Celery app, users with and without permissions,
a factory of dead letters written through the real sink, and a real worker of the Django-sink
app (``dj_worker``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from jobbers_celery.core.records import DeadLetter
from tests.conftest import ROOT, subprocess_env, wait_for

_clock = itertools.count()


@pytest.fixture
def djapp(redis_url: str) -> Any:
    """``tests.django.celery_app`` (its Jobbers on the private Redis, a clean db)."""
    import importlib

    return importlib.import_module("tests.django.celery_app")


@pytest.fixture
def jobbers(djapp: Any) -> Any:
    return djapp.jobbers


def dead_letter(task_id: str | None = None, **over: Any) -> DeadLetter:
    """A dead letter with realistic fields; every call fails a little later than the last."""
    n = next(_clock)
    values: dict[str, Any] = {
        "task_id": task_id or str(uuid.uuid4()),
        "name": "djproj.flaky_import",
        "version": 1,
        "queue": "celery",
        "reason": "failed",
        "args": ["catalog-42"],
        "kwargs": {"password": "hunter2", "region": "eu"},
        "exception_type": "builtins.ValueError",
        "exception_message": f"upstream rejected row {n} of catalog-42",
        "traceback": (
            "Traceback (most recent call last):\n"
            '  File "/srv/app/.venv/lib/python3.11/site-packages/celery/app/trace.py", '
            "line 453, in trace_task\n    R = retval = fun(*args, **kwargs)\n"
            '  File "/srv/app/shop/imports.py", line 88, in flaky_import\n'
            "    raise ValueError(...)\nValueError: upstream rejected row\n"
        ),
        "attempt": 1,
        "retry_attempt": 0,
        "worker": "w1@host",
        "failed_at": datetime(2026, 11, 1, tzinfo=UTC) + timedelta(seconds=n),
        "checkpoint": {"row": 17},
        "options": {"queue": "celery"},
    }
    values.update(over)
    return DeadLetter(**values)


@pytest.fixture
def make_entries(db: None) -> Callable[..., list[str]]:
    """Write ``n`` dead letters through the Django sink; returns their task ids."""
    from jobbers_django.sink import write_entry

    def make(n: int = 1, **over: Any) -> list[str]:
        ids = []
        for _ in range(n):
            entry = dead_letter(**over)
            write_entry(entry)
            ids.append(entry.task_id)
        return ids

    return make


@pytest.fixture
def version_two(djapp: Any, monkeypatch: pytest.MonkeyPatch) -> int:
    """This process now registers ``djproj.flaky_import`` as version 2 (new code deployed);
    its dead letters say version 1."""
    import dataclasses

    task_cls = type(djapp.app.tasks["djproj.flaky_import"])
    monkeypatch.setattr(task_cls, "version", 2)
    monkeypatch.setattr(task_cls, "jobbers_options",
                        dataclasses.replace(task_cls.jobbers_options, version=2))
    return 2


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    """Staff, may view (``jobbers.view_*``), may not resubmit, discard or cancel."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="jobbers", codename__startswith="view_"))
    return user


@pytest.fixture
def operator(django_user_model: Any) -> Any:
    """Staff with ``jobbers.resubmit_deadletter`` and ``jobbers.cancel_task``."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="jobbers",
        codename__in=["view_deadletterentry", "view_deadletterfailure", "view_failuregroup",
                      "view_deadletteraudit", "resubmit_deadletter", "cancel_task"]))
    return user


@pytest.fixture
def outsider(django_user_model: Any) -> Any:
    """Logged in, not staff."""
    return django_user_model.objects.create_user("outsider", password="pw")


@pytest.fixture
def published(djapp: Any) -> Iterator[list[str]]:
    """Ids of the task messages published while the test runs (``before_task_publish``)."""
    from celery.signals import before_task_publish

    seen: list[str] = []

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers and headers.get("id"):
            seen.append(headers["id"])

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any) -> Callable[..., Any]:
    """Run on_commit callbacks (the publish) as a real commit would: the test itself runs
    inside a transaction that never commits."""
    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return fn(*args, **kwargs)
    return run


@pytest.fixture
def dj_worker_args() -> list[str]:
    """More ``celery worker`` options for ``dj_worker`` (a module overrides it: ``-E``...)."""
    return []


def start_dj_worker(djapp: Any, log_path: Path,
                    extra_args: list[str] | None = None) -> subprocess.Popen[str]:
    """Start a prefork worker of tests.django.celery_app writing to pytest-django's test
    database, and wait until it answers a ping."""
    name = f"dj-{uuid.uuid4().hex[:8]}@localhost"
    env = subprocess_env({"DJANGO_SETTINGS_MODULE": "tests.django.settings",
                          "JOBBERS_TEST_DB_NAME": connection.settings_dict["NAME"]})
    with log_path.open("a") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.django.celery_app", "worker",
             "-P", "prefork", "-c", "1", "-n", name, "-l", "INFO", "--without-mingle",
             "--without-gossip", "--without-heartbeat", *(extra_args or [])],
            cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early:\n{log_path.read_text()}")
        return bool(djapp.app.control.ping(destination=[name], timeout=0.5))

    try:
        wait_for(ready, timeout=30, interval=0.1, message="the Django-sink worker")
    except BaseException:
        stop_dj_worker(proc)
        raise
    return proc


def stop_dj_worker(proc: subprocess.Popen[str]) -> None:
    """A warm shutdown (SIGTERM), killed if it takes over 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture
def dj_worker(djapp: Any, tmp_path: Path,
              dj_worker_args: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A prefork worker of tests.django.celery_app writing to pytest-django's test database
    (its log in ``tmp_path / "worker.log"``)."""
    log_path = tmp_path / "worker.log"
    proc = start_dj_worker(djapp, log_path, dj_worker_args)
    try:
        yield proc
    finally:
        stop_dj_worker(proc)
        if os.environ.get("JOBBERS_SHOW_WORKER_LOG"):
            print(log_path.read_text())
