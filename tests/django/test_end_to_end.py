"""End to end: a real worker fails a task, the entry appears in PostgreSQL, the REST API
resubmits it, the task completes with its real (unredacted) arguments, and the entry shows
resubmitted."""

from __future__ import annotations

import uuid

import pytest

from jobbers_celery import TaskState
from jobbers_django.models import DeadLetterEntry
from tests.conftest import wait_for
from tests.django.end_to_end_helpers import fail_appear_resubmit_complete

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_fail_appear_resubmit_complete(djapp, jobbers, dj_worker, operator, client):
    fail_appear_resubmit_complete(djapp, jobbers, operator, client)


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
    record_key = store.keys_of(result.id).task(result.id)
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
