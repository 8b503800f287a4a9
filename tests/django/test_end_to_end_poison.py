"""End to end with a real worker and the Django sink on PostgreSQL: a task published with
values PostgreSQL cannot store (``NaN``, as a plain Python client publishes
``float("nan")``, and a NUL byte, in its arguments and its exception message) fails, and its
dead letter appears stored visibly altered; a normal failing task published after it appears
too. Before: the poison entry was parked in the outbox for good, and every drain stopped at
it."""

from __future__ import annotations

import math
import uuid

import pytest

from jobbers_celery import ALTERED
from jobbers_django.models import DeadLetterEntry
from tests.conftest import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_poison_task_and_the_next_one_both_reach_the_dlq(djapp, jobbers, dj_worker,
                                                             staff, client) -> None:
    key = f"djproj:poison:{uuid.uuid4().hex[:8]}"
    poison = djapp.flaky_import.apply_async(args=[f"{key}\x00", math.nan])
    normal = djapp.flaky_import.delay(f"{key}:normal")

    ids = [poison.id, normal.id]
    wait_for(lambda: DeadLetterEntry.objects.filter(task_id__in=ids).count() == 2,
             timeout=30, message="both dead letters in PostgreSQL")
    by_id = {r.task_id: r for r in DeadLetterEntry.objects.filter(task_id__in=ids)}
    stored = by_id[poison.id]
    assert stored.args == [f"{key}\\u0000", "NaN"]  # visibly altered
    assert "\\u0000" in stored.exception_message
    assert set(stored.options[ALTERED]["fields"]) >= {"args", "exception_message"}
    assert stored.options.get("jobbers_unpublishable")  # never resubmitted with wrong values
    assert by_id[normal.id].args == [f"{key}:normal"]
    assert jobbers.store.client.llen(jobbers.store.keys.dead_letter_outbox) == 0
    assert jobbers.set_aside().total == 0

    client.force_login(staff)
    page = client.get("/jobbers/dead-letter-queue", {"task_name": "djproj.flaky_import"})
    assert page.status_code == 200
    assert {poison.id, normal.id} <= {r["task_id"] for r in page.json()["results"]}
