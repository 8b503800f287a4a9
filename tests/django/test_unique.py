"""A unique task's lock on the operators' pages: the REST task detail names its key (the
digest only), until when, and who holds it; so does the admin's task page."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from jobbers_celery import Unique, Until
from tests.django.api_helpers import API, login


def test_the_task_detail_and_the_task_page_show_the_lock_and_its_holder(
        djapp: Any, jobbers: Any, staff: Any) -> None:
    spec = Unique(on=(0,), until=Until.START)
    first = djapp.flaky_import.apply_async(("catalog-secret-name",), unique=spec)
    again = djapp.flaky_import.apply_async(("catalog-secret-name",), unique=spec)
    assert again.id == first.id  # the second publish sent nothing
    client = login(staff)
    body = client.get(f"{API}/tasks/{first.id}").json()
    lock = body["unique"]
    assert (lock["until"], lock["holder"], lock["held_by_this_task"]) == (
        "start", first.id, True)
    assert len(lock["key"]) == 64
    assert "catalog-secret-name" not in str(lock)
    page = client.get(reverse("admin:jobbers_task", args=[first.id])).content.decode()
    assert f"<code>{lock['key'][:16]}</code>, until start: held by this task" in page
    assert jobbers.cancel(first.id)
    assert client.get(f"{API}/tasks/{first.id}").json()["unique"]["holder"] is None
    plain = djapp.flaky_import.apply_async(("other",))
    assert client.get(f"{API}/tasks/{plain.id}").json()["unique"] is None
