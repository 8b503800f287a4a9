"""The history through Django: ``GET /jobbers/history`` (the same points as
``Jobbers.series``; 400s naming the parameter; the read permission) and the admin's history
page (four inline SVG charts, the names and queues as links, escaped hostile names, 400 on a
bad range, Redis down as a message). The series are written by real lifecycle steps on the
session's private Redis (the Django app's store)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.test import Client
from django.urls import reverse
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery import TaskState
from tests.conftest import free_port
from tests.django.api_helpers import API, assert_bad, login

pytestmark = pytest.mark.django_db
S = TaskState
HOSTILE = "shop.\x1b[2Jevil<script>"


def _run(jobbers: Any, task_id: str, name: str, to: TaskState, queue: str = "celery") -> None:
    store = jobbers.store
    assert store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                      create={"name": name, "queue": queue, "ver": "1"},
                      reason="published", name=name).applied
    assert store.step(task_id, S.STARTED, start=True, worker="w1").applied
    assert store.step(task_id, to).applied


@pytest.fixture
def filled(jobbers: Any) -> Any:
    for i in range(6):
        _run(jobbers, f"ok-{i}", "shop.import", S.COMPLETED)
    for i in range(2):
        _run(jobbers, f"ko-{i}", "shop.import", S.FAILED, queue="slow")
    _run(jobbers, "h-1", HOSTILE, S.COMPLETED)
    return jobbers


# ---------------------------------------------------------------------- the API
def test_the_api_answers_the_series_of_a_name_a_queue_and_everything(filled, staff):
    client = login(staff)
    body = client.get(f"{API}/history", {"name": "shop.import", "since": "30m"}).json()
    assert body["name"] == "shop.import"
    assert body["step_minutes"] == 1
    assert len(body["points"]) >= 30
    assert sum(p["completed"] for p in body["points"]) == 6
    assert sum(p["failed"] for p in body["points"]) == 2
    busy = [p for p in body["points"] if p["throughput"]]
    assert all(p["at"].endswith("Z") and p["mean_runtime_ms"] is not None for p in busy)
    assert body == filled.series(name="shop.import", since=_at(body["since"]),
                                 until=_at(body["until"])).as_dict()
    slow = client.get(f"{API}/history", {"queue": "slow", "step": "5"}).json()
    assert sum(p["failed"] for p in slow["points"]) == 2
    assert slow["step_minutes"] == 5
    every = client.get(f"{API}/history").json()
    assert sum(p["throughput"] for p in every["points"]) == 9
    listed = client.get(f"{API}/history", {"names": "true"}).json()
    assert listed == {"names": sorted(["shop.import", HOSTILE]), "queues": ["celery", "slow"]}


def _at(text: str) -> Any:
    from datetime import datetime
    return datetime.fromisoformat(text)


@pytest.mark.parametrize(("query", "field"), [
    ({"since": "7w"}, "since"),
    ({"since": "yesterday"}, "since"),
    ({"since": "2026-01-01T00:00:00"}, "since"),  # no zone
    ({"since": "30d", "until": "20d"}, "since"),  # before the days kept
    ({"since": "1h", "until": "2h"}, "since"),
    ({"since": "7d", "step": "1"}, "since"),  # too many points
    ({"step": "7"}, "step"),
    ({"name": "a", "queue": "b"}, "queue"),
    ({"name": "x" * 801}, "name"),
    ({"limit": "5"}, "limit"),
])
def test_bad_ranges_are_400s_naming_the_parameter(jobbers, staff, query, field):
    assert_bad(login(staff).get(f"{API}/history", query), field)


def test_reading_the_history_needs_the_read_permission(jobbers, staff, outsider,
                                                      django_user_model):
    blind = django_user_model.objects.create_user("blind", password="pw", is_staff=True)
    assert login(blind).get(f"{API}/history").status_code == 403
    assert login(outsider).get(f"{API}/history").status_code == 403
    assert Client().get(f"{API}/history").status_code in (401, 403)
    assert login(staff).get(f"{API}/history").status_code == 200
    page = reverse("admin:jobbers_history")
    assert login(blind).get(page).status_code == 403
    assert login(outsider).get(page).status_code == 302  # the admin's login page


# ---------------------------------------------------------------------- the page
def test_the_page_draws_four_charts_and_links_names_and_queues(filled, staff):
    client = login(staff)
    page = client.get(reverse("admin:jobbers_history"), {"name": "shop.import",
                                                         "range": "1h"})
    assert page.status_code == 200
    text = page.content.decode()
    assert text.count('<svg class="jobbers-chart"') == 4
    for caption in ("Throughput", "Failure rate", "Mean runtime", "Mean queue latency"):
        assert caption in text
    assert "<td>8</td><td>2</td><td>25.0%</td>" in text  # ended, failed, failure rate
    assert "?range=1h&amp;queue=slow" in text
    assert "<script>" not in text.split("</head>")[1]  # the hostile name is escaped
    assert "shop.\\x1b[2Jevil&lt;script&gt;" in text
    assert '<strong aria-current="page">1 hour</strong>' in text
    for chosen in ("24h", "7d"):
        assert client.get(reverse("admin:jobbers_history"),
                          {"range": chosen}).status_code == 200


def test_the_page_refuses_a_bad_range_and_says_when_redis_is_down(jobbers, staff,
                                                                   monkeypatch):
    client = login(staff)
    url = reverse("admin:jobbers_history")
    bad = client.get(url, {"range": "2y"})
    assert bad.status_code == 400
    assert "Choose a range" in bad.content.decode()
    assert client.get(url, {"name": "a", "queue": "b"}).status_code == 400
    monkeypatch.setattr(jobbers.store, "client", redis.Redis(
        port=free_port(), retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.2))
    down = client.get(url)
    assert down.status_code == 200
    assert "Redis is unreachable" in down.content.decode()


def test_an_entrys_own_change_history_page_is_left_alone(make_entries, staff):
    """The page's view is not ``history_view``: ModelAdmin's object history stays."""
    from jobbers_django.models import DeadLetterEntry

    make_entries(1)
    pk = DeadLetterEntry.objects.get().pk
    page = login(staff).get(reverse("admin:jobbers_deadletterentry_history", args=[pk]))
    assert page.status_code == 200
    assert "jobbers-chart" not in page.content.decode()
