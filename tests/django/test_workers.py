"""The workers and queues page and endpoints: reading under the read rule, pausing and
resuming under ``JOBBERS_PAUSE_PERMISSION`` (a confirmation page, a POST with its CSRF
token), clear 400s, and hostile hostnames and task names shown escaped. PostgreSQL and the
session's private Redis (the broker's queues read for real; the workers' inspect replies
are a fixed list here, the real ones are tests/integration/test_pauses.py's)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from jobbers_celery import RunningTask, TaskState, WorkerView

pytestmark = pytest.mark.django_db

HOSTILE_HOST = "w1@h\x1b]0;owned\x07<script>alert(1)</script>"
HOSTILE_NAME = "shop.import\u202e<b>x</b>"


@pytest.fixture
def views(monkeypatch: pytest.MonkeyPatch, jobbers: Any) -> list[WorkerView]:
    got = [WorkerView(HOSTILE_HOST, True, "prefork", 4, 1234, ["celery"], [
        RunningTask("t-1", HOSTILE_NAME, datetime(2026, 1, 1, tzinfo=UTC),
                    datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC),
                    {"chunk": 3, "of": 10, "password": "hunter2"}, 1)])]
    monkeypatch.setattr(type(jobbers), "worker_views", lambda self, timeout=1.0: got)
    return got


@pytest.fixture
def boss(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("boss", password="pw")


def _api(name: str) -> str:
    return reverse(f"jobbers:{name}")


def test_api_reads_workers_and_queues(client, staff, views):
    client.force_login(staff)
    got = client.get(_api("workers")).json()
    assert got[0]["hostname"] == HOSTILE_HOST  # JSON keeps the value; pages escape it
    assert got[0]["pool"] == "prefork"
    assert got[0]["concurrency"] == 4
    assert got[0]["running"][0]["progress"]["password"] != "hunter2"
    queues = client.get(_api("queues")).json()
    celery = next(q for q in queues if q["name"] == "celery")
    assert celery["depth"] == 0
    assert celery["consumers"] == [HOSTILE_HOST]
    assert client.get(_api("queues") + "?x=1").status_code == 400


def test_api_pause_needs_the_pause_permission_and_answers_clear_400s(client, staff, boss,
                                                                    views, jobbers):
    client.force_login(staff)
    body = {"task": "djproj.flaky_import"}
    assert client.post(_api("pause"), body, content_type="application/json"
                       ).status_code == 403
    client.force_login(boss)
    for bad, field in (({}, "body"), ({"task": "a", "queue": "b"}, "body"),
                       ({"task": ""}, "task"), ({"queue": "x" * 201}, "queue"),
                       ({"task": "a\nb"}, "task"), ({"task": "a", "why": 1}, "why")):
        got = client.post(_api("pause"), bad, content_type="application/json")
        assert got.status_code == 400, bad
        assert field in got.json()["errors"], got.json()
    first = client.post(_api("pause"), body, content_type="application/json")
    assert first.status_code == 201
    assert first.json()["changed"]
    assert client.post(_api("pause"), body, content_type="application/json"
                       ).status_code == 200
    listed = client.get(_api("pauses")).json()
    assert [(p["kind"], p["target"], p["held"]) for p in listed] == [
        ("task", "djproj.flaky_import", 0)]
    assert listed[0]["by"] == "api:boss"
    done = client.post(_api("resume"), body, content_type="application/json")
    assert done.status_code == 200
    assert done.json()["released"] == 0
    assert client.post(_api("resume"), body, content_type="application/json"
                       ).status_code == 404
    assert jobbers.pauses() == []


def test_the_page_escapes_what_workers_report_and_hides_buttons_without_permission(
        client, staff, views):
    client.force_login(staff)
    page = client.get(reverse("admin:jobbers_workers"))
    assert page.status_code == 200
    text = page.content.decode()
    assert "<script>alert(1)</script>" not in text
    assert "\x1b" not in text
    assert "\\x1b]0;owned\\x07&lt;script&gt;" in text
    assert "\\u202e&lt;b&gt;x&lt;/b&gt;" in text
    assert "\u202e" not in text
    assert "hunter2" not in text
    assert "chunk 3 of 10" in text
    assert "Pause…" not in text
    assert "Resume…" not in text
    assert client.get(reverse("admin:jobbers_pause") + "?action=pause&kind=queue&target=q"
                      ).status_code == 403


def test_pause_and_resume_from_the_page_behind_confirmation_and_csrf(boss, views, jobbers):
    client = Client(enforce_csrf_checks=True)
    client.force_login(boss)
    page = client.get(reverse("admin:jobbers_workers")).content.decode()
    assert "Pause…" in page
    url = reverse("admin:jobbers_pause")
    confirm = client.get(url + "?action=pause&kind=queue&target=reports%0Aq")
    assert confirm.status_code == 200
    text = confirm.content.decode()
    assert "reports\\nq" in text
    assert "csrfmiddlewaretoken" in text
    token = confirm.cookies["csrftoken"].value
    assert client.post(url, {"action": "pause", "kind": "queue", "target": "reports"}
                       ).status_code == 403  # no CSRF token
    assert jobbers.pauses() == []
    done = client.post(url, {"action": "pause", "kind": "queue", "target": "reports",
                             "csrfmiddlewaretoken": token})
    assert done.status_code == 302
    assert [p.target for p in jobbers.pauses()] == ["reports"]
    assert any("Queue reports paused" in str(m) for m in get_messages(done.wsgi_request))
    page = client.get(reverse("admin:jobbers_workers")).content.decode()
    assert "<strong>paused</strong>" in page
    assert "Resume…" in page
    refused = client.post(url, {"action": "pause", "kind": "queue", "target": "a\nb",
                                "csrfmiddlewaretoken": token})
    assert any("Not done" in str(m) for m in get_messages(refused.wsgi_request))
    client.post(url, {"action": "resume", "kind": "queue", "target": "reports",
                      "csrfmiddlewaretoken": token})
    assert jobbers.pauses() == []


def test_outsider_reads_nothing(client, outsider, views):
    client.force_login(outsider)
    assert client.get(_api("workers")).status_code == 403
    assert client.get(reverse("admin:jobbers_workers")).status_code == 302  # to the login



def test_a_held_task_reads_paused_on_the_live_page(client, staff, jobbers, djapp):
    from django.urls import reverse as url

    from jobbers_celery.core.pauses import held_reason

    task_id = "held-1"
    jobbers.store.submit(task_id, sources=(TaskState.UNSUBMITTED,),
                         create={"name": "djproj.flaky_import", "queue": "celery",
                                 "ver": "1", "dlq": "0"},
                         fields={"msg": "{}"}, reason="published", name="djproj.flaky_import")
    jobbers.pause(name="djproj.flaky_import")
    assert jobbers.store.hold(task_id, "djproj.flaky_import", worker="w1",
                              reason=held_reason("djproj.flaky_import")).applied
    client.force_login(staff)
    text = client.get(url("admin:jobbers_live")).content.decode()
    row = text[text.index("held-1"):]
    assert "paused: held until resumed" in row[:1500]
    jobbers.resume(name="djproj.flaky_import")


def test_the_entries_list_links_to_the_page(client, staff):
    client.force_login(staff)
    text = client.get(reverse("admin:jobbers_deadletterentry_changelist")).content.decode()
    assert f'href="{reverse("admin:jobbers_workers")}">Workers and queues</a>' in text
