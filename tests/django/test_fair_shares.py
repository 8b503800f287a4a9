"""What fair shares hold back, in the REST API (the read rule) and on the admin's live page:
per task name and key (its digest's first 8 hex digits, never the value), hostile names
shown escaped. PostgreSQL and the session's private Redis (tasks parked by the store's own
publish step)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from jobbers_celery import TaskState
from jobbers_celery.core.fairshare import FairKey, key_digest

pytestmark = pytest.mark.django_db

HOSTILE_NAME = "shop.import\u202e<b>x</b>"
SECRET_TENANT = "acme-secret-tenant"


@pytest.fixture
def parked(jobbers: Any) -> FairKey:
    key = FairKey(key_digest(SECRET_TENANT), 2)
    states = [jobbers.store.submit(f"fs-{i}", sources=(TaskState.UNSUBMITTED,),
                                   reason="published", name=HOSTILE_NAME,
                                   create={"name": HOSTILE_NAME, "queue": "celery",
                                           "msg": "{}"}, fair=key).state for i in range(5)]
    assert states.count(TaskState.SCHEDULED) == 3
    return key


def test_api_lists_what_is_held_back_under_the_read_rule(client, staff, outsider, parked):
    url = reverse("jobbers:fair-shares")
    client.force_login(outsider)
    assert client.get(url).status_code == 403
    client.force_login(staff)
    got = client.get(url).json()
    assert got == [{"name": HOSTILE_NAME, "key": parked.short, "digest": parked.digest,
                    "cap": 2, "parked": 3, "on_the_way": 2, "running": 0}]
    assert SECRET_TENANT not in str(got)
    assert client.get(url + "?x=1").status_code == 400


def test_live_page_shows_the_keys_escaped(client, staff, parked):
    client.force_login(staff)
    page = client.get(reverse("admin:jobbers_live")).content.decode()
    fair = page[page.index('id="jobbers-fair"'):page.index('id="jobbers-cleaner"')]
    assert "(1 keys)" in fair
    assert f"<code>{parked.short}</code>" in fair
    assert "<b>x</b>" not in fair  # the name is escaped
    assert SECRET_TENANT not in page
