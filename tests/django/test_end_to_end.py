"""End to end: a real worker fails a task, the entry appears in PostgreSQL, the REST API
resubmits it, the task completes with its real (unredacted) arguments, and the entry shows
resubmitted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from jobbers_celery import TaskState
from jobbers_django.models import DeadLetterEntry, Status
from tests.conftest import ROOT, subprocess_env, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def dj_worker(djapp: Any, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A prefork worker of tests.django.celery_app writing to pytest-django's test database."""
    name = f"dj-{uuid.uuid4().hex[:8]}@localhost"
    log_path = tmp_path / "worker.log"
    env = subprocess_env({"DJANGO_SETTINGS_MODULE": "tests.django.settings",
                          "JOBBERS_TEST_DB_NAME": connection.settings_dict["NAME"]})
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.django.celery_app", "worker",
             "-P", "prefork", "-c", "1", "-n", name, "-l", "INFO", "--without-mingle",
             "--without-gossip", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early:\n{log_path.read_text()}")
        return bool(djapp.app.control.ping(destination=[name], timeout=0.5))

    try:
        wait_for(ready, timeout=30, interval=0.1, message="the Django-sink worker")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if os.environ.get("JOBBERS_SHOW_WORKER_LOG"):
            print(log_path.read_text())


def test_fail_appear_resubmit_complete(djapp, jobbers, dj_worker, operator, client):
    key = f"djproj:e2e:{uuid.uuid4().hex[:8]}"
    result = djapp.flaky_import.delay(key, password="hunter2")

    entry = wait_for(lambda: DeadLetterEntry.objects.filter(task_id=result.id).first(),
                     timeout=20, message="the dead-letter entry in PostgreSQL")
    assert entry.status == Status.DEAD
    assert entry.exception_type == "ValueError"
    assert entry.kwargs == {"password": "hunter2"}
    assert entry.failures.count() == 1
    assert jobbers.get(result.id).state == TaskState.FAILED

    jobbers.store.client.set(key, "fixed")  # the "deploy the fix" step
    client.force_login(operator)
    response = client.post("/jobbers/dead-letter-queue/resubmit",
                           {"task_ids": [result.id], "reset_retry_count": True},
                           content_type="application/json")
    assert response.status_code == 200, response.content
    assert b"hunter2" not in response.content

    record = wait_for(lambda: (r := jobbers.get(result.id)) and r.state == TaskState.COMPLETED
                      and r, timeout=20, message="the resubmitted task to complete")
    assert record.attempt == 2
    assert result.get(timeout=5) == {"attempt": 2, "checkpoint": None, "password": "hunter2"}
    path = [(t.from_state, t.to_state) for t in jobbers.history(result.id)]
    assert (TaskState.FAILED, TaskState.SUBMITTED) in path
    entry.refresh_from_db()
    assert (entry.status, entry.resubmit_count, entry.failure_count) == (
        Status.RESUBMITTED, 1, 1)


def test_a_big_payload_lives_in_the_database_only_and_resubmits_whole(
        djapp, jobbers, dj_worker, operator, client):
    key = f"djproj:big:{uuid.uuid4().hex[:8]}"
    data = "x" * 3_000_000
    result = djapp.big_import.delay(key, data)

    entry = wait_for(lambda: DeadLetterEntry.objects.filter(task_id=result.id).first(),
                     timeout=20, message="the dead-letter entry in PostgreSQL")
    assert entry.args == [key, data]
    # the database keeps the payload: the record drops its copy, Redis holds none
    store = jobbers.store
    record_key = store.keys.task(result.id)
    wait_for(lambda: not store.client.hexists(record_key, "msg"), timeout=10,
             message="the record to drop its copy")
    sizes = {k: store.client.memory_usage(k, samples=0) for k in store.client.scan_iter()}
    # no payload; its error message (over 64 bytes) keeps the hash out of Redis's compact
    # encoding: ~1.5 KB
    assert sizes[record_key] <= 2048
    assert max(sizes.values()) < 100_000, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]

    client.force_login(operator)
    page = client.get(f"/admin/jobbers/deadletterentry/{entry.pk}/change/")
    assert page.status_code == 200
    assert len(page.content) < 100_000
    assert b"[cut for display: 3,000,000 characters in all]" in page.content
    listing = client.get("/jobbers/dead-letter-queue", {"task_name": "djproj.big_import"})
    assert len(listing.content) < 100_000
    assert [row["truncated"] for row in listing.json()["results"]] == [["args"]]

    store.client.set(key, "fixed")
    response = client.post("/jobbers/dead-letter-queue/resubmit", {"task_ids": [result.id]},
                           content_type="application/json")
    assert response.status_code == 200, response.content
    wait_for(lambda: (r := jobbers.get(result.id)) and r.state == TaskState.COMPLETED,
             timeout=20, message="the resubmitted task to complete")
    assert result.get(timeout=5) == len(data)  # the worker got the whole argument
