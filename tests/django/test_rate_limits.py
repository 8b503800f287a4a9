"""The rate limits page and endpoints: reading under the read rule, setting and clearing an
override under ``JOBBERS_RATE_LIMIT_PERMISSION`` (a POST with its CSRF token on the page),
clear 400s, and a hostile task name shown escaped. PostgreSQL and the session's private
Redis (the limit itself at work: tests/integration/test_ratelimit.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db

HOSTILE = "shop.import\u202e<b>x</b>\x1b]0;owned\x07"


@pytest.fixture
def boss(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("boss", password="pw")


def _api(name: str) -> str:
    return reverse(f"jobbers:{name}")


def _post(client: Client, body: dict[str, Any]) -> Any:
    return client.post(_api("rate-limit-set"), body, content_type="application/json")


RATED = "djproj.rated_import"


def _rated_import(key: str) -> str:
    return key


@pytest.fixture
def rated(djapp: Any) -> Any:
    """A task with ``rate_limit_by`` (3/h per call), registered for the test."""
    from jobbers_celery import JobbersTask, RateLimit

    task = djapp.app.task(base=JobbersTask, name=RATED, rate_limit_by=RateLimit("3/h"))(
        _rated_import)
    yield task
    djapp.app.tasks.pop(RATED, None)


def test_api_sets_reads_and_clears_an_override_with_its_permission(client, staff, boss,
                                                                   jobbers, rated):
    client.force_login(staff)
    assert client.get(_api("rate-limits")).json() == [
        {"name": RATED, "declared": "3/h", "override": None, "effective": "3/h",
         "key": "one limit for every call", "held": 0}]
    assert _post(client, {"task": RATED, "rate": "5/m"}).status_code == 403
    client.force_login(boss)
    for bad, field in (({"task": RATED, "rate": "fast"}, "rate"), ({"task": RATED}, "rate"),
                       ({"task": RATED, "rate": "1" * 40 + "/s"}, "rate"),
                       ({"task": "x" * 201, "rate": "1/s"}, "task"),
                       ({"task": RATED, "rate": "1/s", "why": 1}, "why"),
                       ({"task": RATED, "rate": "0/s"}, "rate"),
                       # a task without rate_limit_by never reads an override
                       ({"task": "djproj.flaky_import", "rate": "5/m"}, "task"),
                       ({"task": "no.such.task", "rate": "off"}, "task")):
        got = _post(client, bad)
        assert got.status_code == 400, bad
        assert field in got.json()["errors"], got.json()
    assert "rate_limit_by" in _post(client, {"task": "djproj.flaky_import", "rate": "5/m"}
                                    ).json()["errors"]["task"][0]
    done = _post(client, {"task": RATED, "rate": " 5 / min "})
    assert done.status_code == 200
    assert done.json() == [{"name": RATED, "declared": "3/h", "override": "5/m",
                            "effective": "5/m", "key": "one limit for every call", "held": 0}]
    assert {i.name: i for i in jobbers.rate_limits()}[RATED].override == "5/m"
    assert _post(client, {"task": RATED, "rate": "off"}).json()[0]["effective"] is None
    assert client.get(_api("rate-limits") + "?x=1").status_code == 400
    assert _post(client, {"task": RATED, "rate": None}).json()[0]["override"] is None
    jobbers.set_rate_limit("djproj.flaky_import", "5/m")  # set elsewhere: shown not applied
    row = _post(client, {"task": "djproj.flaky_import", "rate": None}).json()
    assert row == []  # clearing one is always allowed
    assert [i.name for i in jobbers.rate_limits()] == [RATED]


def test_admin_page_lists_sets_and_refuses_with_a_400(client, staff, boss, jobbers, rated):
    jobbers.set_rate_limit(HOSTILE, "2/s")
    page = reverse("admin:jobbers_rate_limits")
    client.force_login(staff)
    got = client.get(page)
    assert got.status_code == 200
    html = got.content.decode()
    assert "\x1b" not in html
    assert "<b>x</b>" not in html
    assert "\u202e" not in html
    assert "2/s" in html
    assert "not applied" in html  # HOSTILE is no task with rate_limit_by here
    assert 'name="rate"' not in html  # staff reads, may not change
    assert client.post(page, {"name": "a", "rate": "1/s"}).status_code == 403
    client.force_login(boss)
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(boss)
    assert csrf.post(page, {"name": "a", "rate": "1/s"}).status_code == 403  # no token
    bad = client.post(page, {"name": RATED, "rate": "fast"})
    assert bad.status_code == 400
    assert "not a rate" in bad.content.decode()
    unread = client.post(page, {"name": "djproj.flaky_import", "rate": "3/h"})
    assert unread.status_code == 400
    assert "not a task with rate_limit_by here" in unread.content.decode()
    done = client.post(page, {"name": RATED, "rate": "1/h"})
    assert done.status_code == 302
    assert {i.name: i.override for i in jobbers.rate_limits()}[RATED] == "1/h"
    assert client.post(page, {"name": RATED, "clear": "1"}).status_code == 302
    assert [i.name for i in jobbers.rate_limits()] == [RATED, HOSTILE]


def test_the_live_page_says_what_the_rate_limits_hold_back(client, staff, jobbers,
                                                          monkeypatch):
    from jobbers_celery import RateLimitInfo

    monkeypatch.setattr(type(jobbers), "rate_limits", lambda self: [
        RateLimitInfo(HOSTILE, "10/s", None, "argument 'account'", 7),
        RateLimitInfo("shop.idle", "1/m", None, "-", 0)])
    client.force_login(staff)
    html = client.get(reverse("admin:jobbers_live")).content.decode()
    held = html.split('id="jobbers-rate-held"')[1].split("</p>")[0]
    assert " 7 at 10/s" in held
    assert "shop.idle" not in held  # nothing waiting: not listed
    assert "\x1b" not in held
    assert "<b>x</b>" not in held
