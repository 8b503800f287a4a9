"""The beat watch through Django: ``GET /jobbers/periodic-tasks`` (what
``Jobbers.periodic_tasks`` reads; a 400 naming ``runs``; the read permission) and the admin's
periodic tasks page (each schedule with its counts and runs, a hostile name escaped, Redis
down as a message). Written by the watch itself on the session's private Redis."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.test import Client
from django.urls import reverse
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery.lifecycle.periodic import ScheduleInfo
from tests.conftest import free_port
from tests.django.api_helpers import API, assert_bad, login

pytestmark = pytest.mark.django_db
HOSTILE = "nightly \x1b[2J<script>alert(1)</script>"


@pytest.fixture
def watched(jobbers: Any) -> Any:
    watch = jobbers.periodic
    tick = ScheduleInfo.of("tick", "shop.tick", "<freq: 10.00 seconds>", 10_000, 10_000)
    odd = ScheduleInfo.of(HOSTILE, "shop.report", "<crontab: 0 4 * * *>", 86_400_000, -30_000)
    watch.learn([tick, odd], "beat", beat="beat@test")
    watch.published(tick, "run-1", -20_000)  # 20 s past its slot: late at its start
    watch.started("tick", "run-1", "shop.tick")
    watch.ended("tick", "run-1", "SUCCESS")
    watch.published(tick, "run-2", 0)
    watch.started("tick", "run-2", "shop.tick")
    watch.published(tick, "run-3", 0)
    watch.started("tick", "run-3", "shop.tick")  # run-2 still runs...
    watch.ended("tick", "run-2", "SUCCESS")  # ...until after run-3 started: overlapping
    watch.judge()  # the hostile schedule's slot passed 30 s ago: missed
    return jobbers


def test_the_api_lists_each_schedule_with_its_counts_and_runs(watched, staff):
    client = login(staff)
    body = client.get(f"{API}/periodic-tasks").json()
    assert body["count"] == 2
    by_name = {s["name"]: s for s in body["results"]}
    tick = by_name["tick"]
    assert (tick["missed"], tick["late"], tick["overlapping"], tick["runs_total"]) == (0, 1, 1, 3)
    assert tick["task"] == "shop.tick"
    assert tick["source"] == "beat"
    assert tick["period_seconds"] == 10
    assert [r["id"] for r in tick["runs"]][:1] == ["run-3"]
    assert all(r["slot_at"].endswith("Z") for r in tick["runs"])
    assert by_name[HOSTILE]["missed"] == 1
    assert by_name[HOSTILE]["runs"][0]["state"] == "missed"
    assert body == {"count": 2, "results": [s.as_dict() for s in
                                            watched.periodic_tasks(runs=10)]}
    assert client.get(f"{API}/periodic-tasks", {"runs": "0"}).json()["results"][0]["runs"] == []


@pytest.mark.parametrize("query", [{"runs": "-1"}, {"runs": "101"}, {"runs": "x"},
                                   {"limit": "5"}])
def test_bad_queries_are_400s_naming_the_parameter(jobbers, staff, query):
    assert_bad(login(staff).get(f"{API}/periodic-tasks", query), next(iter(query)))


def test_reading_needs_the_read_permission(jobbers, staff, outsider, django_user_model):
    blind = django_user_model.objects.create_user("blind", password="pw", is_staff=True)
    assert login(blind).get(f"{API}/periodic-tasks").status_code == 403
    assert login(outsider).get(f"{API}/periodic-tasks").status_code == 403
    assert Client().get(f"{API}/periodic-tasks").status_code in (401, 403)
    page = reverse("admin:jobbers_periodic")
    assert login(blind).get(page).status_code == 403
    assert login(outsider).get(page).status_code == 302  # the admin's login page
    assert login(staff).get(page).status_code == 200


def test_the_page_shows_counts_and_runs_and_escapes_names(watched, staff):
    page = login(staff).get(reverse("admin:jobbers_periodic"))
    assert page.status_code == 200
    text = page.content.decode()
    assert "<script>alert" not in text
    assert "nightly \\x1b[2J&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "shop.tick" in text
    assert "&lt;freq: 10.00 seconds&gt;" in text
    assert "<td>0</td>\n          <td>1</td>\n          <td>1</td>" in text  # missed late overlap
    assert "overlapping" in text
    assert "late" in text
    assert ">missed<" in text
    assert reverse("admin:jobbers_task", args=["run-3"]) in text


def test_the_page_without_schedules_and_with_redis_down(jobbers, staff, monkeypatch):
    client = login(staff)
    url = reverse("admin:jobbers_periodic")
    assert "No schedule is watched yet" in client.get(url).content.decode()
    monkeypatch.setattr(jobbers.store, "client", redis.Redis(
        port=free_port(), retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.2))
    down = client.get(url)
    assert down.status_code == 200
    assert "Redis is unreachable" in down.content.decode()


def test_the_entries_list_links_the_page(jobbers, staff):
    listing = login(staff).get(reverse("admin:jobbers_deadletterentry_changelist"))
    assert f'href="{reverse("admin:jobbers_periodic")}"' in listing.content.decode()


def test_the_alerts_link_is_the_pages_path():
    from jobbers_celery.lifecycle.periodic import PERIODIC_PAGE

    assert reverse("admin:jobbers_periodic") == reverse("admin:index") + PERIODIC_PAGE
