"""The Django dead-letter end to end, shared by ``test_end_to_end.py`` (Redis broker) and
``test_end_to_end_rabbitmq.py``: a real worker (the ``dj_worker`` fixture of conftest.py)
fails a task, the entry appears in PostgreSQL, the REST API resubmits it, the task completes
with its real (unredacted) arguments, and the entry shows resubmitted."""

from __future__ import annotations

import uuid
from typing import Any

from jobbers_celery import TaskState
from jobbers_django.models import DeadLetterEntry, Status
from tests.conftest import wait_for


def fail_appear_resubmit_complete(djapp: Any, jobbers: Any, operator: Any,
                                  client: Any) -> None:
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
