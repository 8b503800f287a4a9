"""The REST API, read side and guards: the dead-letter list (filters, pagination, ordering,
bounded count), failure history, task detail, scheduled tasks, validation (400 naming the
field, nothing changed), permissions, CSRF, redaction and the OpenAPI schema.

Actions (resubmit, discard, cancel) are in ``test_api_actions.py``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client

from jobbers_celery import TaskState
from jobbers_celery.lifecycle import payload
from jobbers_django.api import deadletters
from jobbers_django.models import DeadLetterEntry, Status
from jobbers_django.sink import write_entry
from tests.conftest import ROOT, subprocess_env
from tests.django.api_helpers import API, assert_bad, ids_of, login, post, snapshot
from tests.django.conftest import dead_letter

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 1, tzinfo=UTC)


# ---------------------------------------------------------------------- list
def test_list_newest_first_with_bounded_count_and_redacted_arguments(make_entries, staff):
    ids = make_entries(3)
    response = login(staff).get(f"{API}/dead-letter-queue")
    assert response.status_code == 200
    page = response.json()
    assert (page["count"], page["count_capped"], page["next"]) == (3, False, None)
    assert ids_of(response) == ids[::-1]
    row = page["results"][0]
    assert row["kwargs"] == {"password": "********", "region": "eu"}
    assert row["args"] == ["catalog-42"]
    assert row["status"] == "dead"
    assert row["last_failed_at"].endswith("Z")
    assert datetime.fromisoformat(row["last_failed_at"]).tzinfo is not None
    assert "traceback" not in row
    assert "hunter2" not in response.content.decode()


def test_list_and_dry_run_cut_big_payloads_and_say_so(make_entries, staff, operator):
    big = "x" * 2_000_000
    # big_import(key, data): the second parameter is no secret (flaky_import's is: password)
    [big_id] = make_entries(1, name="djproj.big_import", args=["catalog-42", big])
    [small_id] = make_entries(1)
    response = login(staff).get(f"{API}/dead-letter-queue")
    assert response.status_code == 200
    assert len(response.content) < 100_000  # not the 2 MB argument
    rows = {row["task_id"]: row for row in response.json()["results"]}
    assert rows[big_id]["truncated"] == ["args"]
    assert rows[big_id]["args"][0] == "catalog-42"
    assert rows[big_id]["args"][1].endswith("[cut for display: 2,000,000 characters in all]")
    assert rows[big_id]["kwargs"] == {"password": "********", "region": "eu"}
    assert rows[small_id]["truncated"] == []
    assert rows[small_id]["args"] == ["catalog-42"]

    answer = post(login(operator), "dead-letter-queue/resubmit",
                  {"task_ids": [big_id], "dry_run": True})
    assert answer.status_code == 200, answer.content
    assert len(answer.content) < 100_000
    [sample] = answer.json()["sample"]
    assert sample["truncated"] == ["args"]
    assert DeadLetterEntry.objects.get(task_id=big_id).args == ["catalog-42", big]  # whole


def test_list_filters(db, staff):
    base = {"failed_at": T0}
    specs = {
        "a": {},
        "b": {"queue": "imports"},
        "c": {"name": "djproj.other"},
        "d": {"version": 2},
        "e": {"exception_type": "builtins.KeyError", "exception_message": "'sku'"},
        "f": {"reason": "stalled"},
        "g": {"failed_at": T0 + timedelta(hours=2)},
    }
    for task_id, over in specs.items():
        write_entry(dead_letter(task_id, **{**base, **over}))
    DeadLetterEntry.objects.filter(task_id="a").update(status=Status.DISCARDED)
    fp_e = DeadLetterEntry.objects.get(task_id="e").fingerprint
    client = login(staff)

    def listed(query: str) -> set[str]:
        response = client.get(f"{API}/dead-letter-queue?{query}")
        assert response.status_code == 200, response.content
        return set(ids_of(response))

    assert listed("queue=imports") == {"b"}
    assert listed("task_name=djproj.other") == {"c"}
    assert listed("task_name=djproj.flaky_import&task_version=2") == {"d"}
    assert listed("exception_type=builtins.KeyError") == {"e"}
    assert listed(f"fingerprint={fp_e}") == {"e"}
    assert listed("reason=stalled") == {"f"}
    assert listed("status=discarded") == {"a"}
    assert listed("status=dead&queue=celery") == {"c", "d", "e", "f", "g"}
    assert listed("failed_after=2026-11-01T01:00:00Z") == {"g"}
    # without an offset it is UTC; with one it is converted (``+`` encoded in a query)
    assert listed("failed_after=2026-11-01T01:00:00") == {"g"}
    assert listed("failed_after=2026-11-01T03:00:00%2B02:00") == {"g"}
    assert "g" not in listed("failed_before=2026-11-01T02:00:00Z")
    assert listed("failed_after=2026-11-01T00:00:00Z&failed_before=2026-11-01T00:00:01Z") \
        == set(specs) - {"g"}


def test_list_pages_follow_the_cursor_without_gaps_or_repeats(make_entries, staff):
    ids = make_entries(7)
    client = login(staff)
    url: str | None = f"{API}/dead-letter-queue?limit=3&task_name=djproj.flaky_import"
    seen: list[str] = []
    pages = 0
    while url:
        response = client.get(url)
        assert response.status_code == 200
        page = response.json()
        assert page["count"] == 7
        seen += ids_of(response)
        url = page["next"]
        pages += 1
        if url:
            assert "task_name=djproj.flaky_import" in url
            assert "limit=3" in url
    assert (pages, seen) == (3, ids[::-1])


def test_list_count_stops_at_the_cap(make_entries, staff, monkeypatch):
    monkeypatch.setattr(deadletters, "COUNT_CAP", 4)
    make_entries(6)
    page = login(staff).get(f"{API}/dead-letter-queue?limit=2").json()
    assert (page["count"], page["count_capped"], len(page["results"])) == (4, True, 2)


@pytest.mark.parametrize(("ordering", "key", "reverse"), [
    ("-last_failed_at", "last_failed_at", True),
    ("last_failed_at", "last_failed_at", False),
    ("-first_failed_at", "first_failed_at", True),
    ("first_failed_at", "first_failed_at", False),
    ("-failure_count", "failure_count", True),
    ("failure_count", "failure_count", False),
    ("task_name", "task_name", False),
    ("-task_name", "task_name", True),
])
def test_list_ordering_allowlist_pages_in_order(db, staff, ordering, key, reverse):
    for n in range(5):
        first = dead_letter(name=f"djproj.task{n % 3}", failed_at=T0 + timedelta(minutes=n))
        write_entry(first)
        for attempt in range(2, 2 + (n * 2) % 5):  # various failure counts, with ties
            write_entry(dead_letter(first.task_id, name=first.name, attempt=attempt,
                                    failed_at=T0 + timedelta(hours=attempt, minutes=n)))
    client = login(staff)
    url: str | None = f"{API}/dead-letter-queue?limit=2&ordering={ordering}"
    rows: list[dict[str, Any]] = []
    while url:
        page = client.get(url).json()
        rows += page["results"]
        url = page["next"]
    assert len({r["task_id"] for r in rows}) == len(rows) == 5
    values = [r[key] for r in rows]
    assert values == sorted(values, reverse=reverse)


@pytest.mark.parametrize(("query", "field"), [
    ("limit=0", "limit"),
    ("limit=-1", "limit"),
    (f"limit={10**9}", "limit"),
    ("limit=abc", "limit"),
    ("limit=", "limit"),
    ("queue=", "queue"),
    ("task_name=", "task_name"),
    ("colour=blue", "colour"),
    ("queue=a&queue=b", "queue"),
    ("task_version=two", "task_version"),
    ("reason=bored", "reason"),
    ("status=alive", "status"),
    ("fingerprint=XYZ", "fingerprint"),
    ("failed_after=yesterday", "failed_after"),
    ("failed_before=2026-13-01T00:00:00Z", "failed_before"),
    ("failed_after=2026-11-02T00:00:00Z&failed_before=2026-11-01T00:00:00Z",
     "failed_before"),
    ("ordering=id", "ordering"),
    ("ordering=-exception_message", "ordering"),
    ("cursor=not-a-cursor", "cursor"),
    (f"task_name={'x' * 256}", "task_name"),
])
def test_list_rejects_bad_queries_naming_the_field(make_entries, staff, query, field):
    make_entries(1)
    assert_bad(login(staff).get(f"{API}/dead-letter-queue?{query}"), field)


def test_list_cursor_is_tied_to_its_ordering(make_entries, staff):
    make_entries(3)
    client = login(staff)
    next_url = client.get(f"{API}/dead-letter-queue?limit=1").json()["next"]
    assert_bad(client.get(next_url + "&ordering=task_name"), "cursor")
    forged = base64.urlsafe_b64encode(
        json.dumps({"o": "-last_failed_at", "v": "2026-11-01T00:00:00", "i": 1}).encode()
    ).decode()
    assert_bad(client.get(f"{API}/dead-letter-queue?cursor={forged}"), "cursor")


# ---------------------------------------------------------------------- history
def test_history_lists_every_failure_oldest_first(db, staff):
    first = dead_letter(attempt=1, failed_at=T0)
    write_entry(dead_letter(first.task_id, attempt=3, reason="stalled", failed_at=T0
                            + timedelta(hours=2), exception_type=None, traceback=None,
                            exception_message="no heartbeat for 61s"))
    write_entry(first)
    response = login(staff).get(f"{API}/dead-letter-queue/{first.task_id}/history")
    assert response.status_code == 200
    body = response.json()
    assert (body["task_id"], body["task_name"], body["status"]) == (
        first.task_id, "djproj.flaky_import", "dead")
    assert [(f["attempt"], f["reason"]) for f in body["failures"]] == [
        (1, "failed"), (3, "stalled")]
    assert body["failures"][0]["traceback"].startswith("Traceback")
    assert body["failures"][0]["failed_at"] == "2026-11-01T00:00:00.000Z"


def test_history_unknown_too_long_and_unexpected_parameters(make_entries, staff):
    (task_id,) = make_entries(1)
    client = login(staff)
    assert client.get(f"{API}/dead-letter-queue/nope-123/history").status_code == 404
    # any characters are an id (Celery runs them): unknown ones are 404s, not 400s
    for odd in ("-bad", "a%20b", f"{task_id}%0A", "x" * 256):
        assert client.get(f"{API}/dead-letter-queue/{odd}/history").status_code == 404
    assert_bad(client.get(f"{API}/dead-letter-queue/{'x' * 4097}/history"), "task_id")
    assert_bad(client.get(f"{API}/dead-letter-queue/{task_id}/history?limit=5"), "limit")


# ---------------------------------------------------------------------- task detail
def test_task_detail_record_transitions_and_entry(make_entries, staff, djapp, jobbers):
    S = TaskState
    checkpoint = {"row": 3, "api_token": "tok-secret"}
    (task_id,) = make_entries(1, checkpoint=checkpoint,
                              options={"queue": "celery",
                                       "headers": {"Authorization": "Bearer abc"}})
    djapp.flaky_import.apply_async(("catalog",), task_id=task_id)
    store = jobbers.store
    assert store.step(task_id, S.STARTED, start=True, worker="w1@host").applied
    assert store.step(task_id, S.FAILED, set_fields={"ckpt": payload.dumps(checkpoint)}
                      ).applied
    response = login(staff).get(f"{API}/tasks/{task_id}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["task_id"] == task_id
    assert body["record"]["state"] == "failed"
    assert body["record"]["name"] == "djproj.flaky_import"
    assert body["record"]["started_at"].endswith("Z")
    assert [(t["from_state"], t["to_state"]) for t in body["transitions"]] == [
        ("unsubmitted", "submitted"), ("submitted", "started"), ("started", "failed")]
    assert body["dead_letter"]["task_id"] == task_id
    assert body["dead_letter"]["options"]["headers"] == {"Authorization": "********"}
    assert body["dead_letter"]["checkpoint"] == {"row": 3, "api_token": "********"}
    assert body["record"]["checkpoint"] == {"row": 3, "api_token": "********"}
    text = response.content.decode()
    for secret in ("hunter2", "tok-secret", "Bearer abc"):
        assert secret not in text


def test_task_detail_of_an_expired_record_unknown_and_malformed(make_entries, staff):
    (task_id,) = make_entries(1)
    client = login(staff)
    body = client.get(f"{API}/tasks/{task_id}").json()
    assert (body["record"], body["transitions"]) == (None, [])
    assert body["dead_letter"]["kwargs"]["password"] == "********"
    assert client.get(f"{API}/tasks/unknown-task").status_code == 404
    assert client.get(f"{API}/tasks/.hidden").status_code == 404
    assert_bad(client.get(f"{API}/tasks/{'x' * 4097}"), "task_id")
    unexpected = client.get(f"{API}/tasks/{task_id}?verbose=1")
    assert_bad(unexpected, "verbose")
    assert unexpected.json()["detail"] == (
        "verbose: unknown query parameter 'verbose'; allowed: none")


# ---------------------------------------------------------------------- scheduled
def test_scheduled_tasks_soonest_first(djapp, jobbers, staff):
    S = TaskState
    for n, delay in enumerate((90_000, 30_000)):
        djapp.flaky_import.apply_async(("catalog",), {"password": "hunter2"}, task_id=f"s{n}")
        assert jobbers.store.step(f"s{n}", S.SCHEDULED, delay_ms=delay).applied
    djapp.flaky_import.apply_async(("catalog",), task_id="still-submitted")
    client = login(staff)
    body = client.get(f"{API}/scheduled-tasks").json()
    assert body["count"] == 2
    assert [r["task_id"] for r in body["results"]] == ["s1", "s0"]
    first = body["results"][0]
    assert (first["state"], first["name"]) == ("scheduled", "djproj.flaky_import")
    run_at = datetime.fromisoformat(first["run_at"])
    assert datetime.now(UTC) < run_at < datetime.now(UTC) + timedelta(seconds=31)
    one = client.get(f"{API}/scheduled-tasks?limit=1").json()
    assert (one["count"], [r["task_id"] for r in one["results"]]) == (2, ["s1"])
    for query, field in (("limit=0", "limit"), ("limit=1001", "limit"),
                         ("limit=x", "limit"), ("state=failed", "state")):
        assert_bad(client.get(f"{API}/scheduled-tasks?{query}"), field)


# ---------------------------------------------------------------------- permissions
READS = ["dead-letter-queue", "dead-letter-queue/{id}/history", "tasks/{id}",
         "scheduled-tasks", "schema"]
ACTIONS = [("dead-letter-queue/resubmit", {"task_ids": ["{id}"], "dry_run": True}),
           ("dead-letter-queue/discard", {"task_ids": ["{id}"], "dry_run": True}),
           ("tasks/{id}/cancel", {})]


def _call(client: Client, endpoint: Any, task_id: str) -> Any:
    if isinstance(endpoint, str):
        return client.get(f"{API}/{endpoint.format(id=task_id)}")
    path, body = endpoint
    body = json.loads(json.dumps(body).replace("{id}", task_id))
    return post(client, path.format(id=task_id), body)


@pytest.mark.parametrize("endpoint", READS + ACTIONS, ids=lambda e: e if isinstance(e, str)
                         else e[0])
def test_permissions_per_endpoint(make_entries, staff, operator, outsider, djapp,
                                  endpoint):
    (task_id,) = make_entries(1)
    djapp.flaky_import.apply_async(("catalog",), task_id=task_id)  # a live record, too
    before = snapshot()
    anonymous = _call(Client(), endpoint, task_id)
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Basic")
    assert _call(login(outsider), endpoint, task_id).status_code == 403
    is_read = isinstance(endpoint, str)
    assert _call(login(staff), endpoint, task_id).status_code == (200 if is_read else 403)
    if endpoint != ACTIONS[2]:  # a cancel changes things; see test_api_actions
        assert snapshot() == before
    assert _call(login(operator), endpoint, task_id).status_code == 200


def test_permission_rules_come_from_the_settings(make_entries, staff, settings):
    (task_id,) = make_entries(1)
    client = login(staff)
    settings.JOBBERS_READ_PERMISSION = "superuser"
    response = client.get(f"{API}/dead-letter-queue")
    assert response.status_code == 403
    assert "JOBBERS_READ_PERMISSION" in response.json()["detail"]
    settings.JOBBERS_READ_PERMISSION = "jobbers.view_deadletterentry"
    assert client.get(f"{API}/dead-letter-queue").status_code == 200
    body = {"task_ids": [task_id], "dry_run": True}
    assert post(client, "dead-letter-queue/resubmit", body).status_code == 403
    settings.JOBBERS_RESUBMIT_PERMISSION = "staff"
    assert post(client, "dead-letter-queue/resubmit", body).status_code == 200
    assert post(client, "dead-letter-queue/discard", body).status_code == 200
    assert post(client, "tasks/unknown/cancel", {}).status_code == 403
    settings.JOBBERS_CANCEL_PERMISSION = "staff"
    assert post(client, "tasks/unknown/cancel", {}).status_code == 404


def test_inactive_users_are_refused(make_entries, operator):
    client = login(operator)
    operator.is_active = False
    operator.save()
    assert client.get(f"{API}/dead-letter-queue").status_code in (401, 403)


# ---------------------------------------------------------------------- CSRF and auth
@pytest.mark.parametrize("path", ["dead-letter-queue/resubmit", "dead-letter-queue/discard",
                                  "tasks/{id}/cancel"])
def test_session_posts_need_the_csrf_token(make_entries, operator, djapp, path):
    (task_id,) = make_entries(1)
    djapp.flaky_import.apply_async(("catalog",), task_id=task_id)
    client = login(operator, enforce_csrf_checks=True)
    body = {} if "cancel" in path else {"task_ids": [task_id], "dry_run": True}
    path = path.format(id=task_id)
    before = snapshot()
    refused = post(client, path, body)
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["detail"]
    assert snapshot() == before
    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    assert post(client, path, body, HTTP_X_CSRFTOKEN="wrong" + token[5:]).status_code == 403
    assert post(client, path, body, HTTP_X_CSRFTOKEN=token).status_code == 200


def test_basic_auth_needs_no_csrf_token_and_checks_the_password(make_entries, operator):
    (task_id,) = make_entries(1)
    client = Client(enforce_csrf_checks=True)
    good = "Basic " + base64.b64encode(b"operator:pw").decode()
    bad = "Basic " + base64.b64encode(b"operator:nope").decode()
    body = {"task_ids": [task_id], "dry_run": True}
    assert post(client, "dead-letter-queue/resubmit", body, HTTP_AUTHORIZATION=good
                ).status_code == 200
    assert post(client, "dead-letter-queue/resubmit", body, HTTP_AUTHORIZATION=bad
                ).status_code == 401


def test_bodies_must_be_json(make_entries, operator):
    (task_id,) = make_entries(1)
    client = login(operator)
    form = client.post(f"{API}/dead-letter-queue/resubmit", {"task_ids": task_id})
    assert form.status_code == 415
    broken = client.post(f"{API}/dead-letter-queue/resubmit", "{nope",
                         content_type="application/json")
    assert broken.status_code == 400
    assert client.get(f"{API}/dead-letter-queue/resubmit").status_code == 405


# ---------------------------------------------------------------------- schema
ALL_PATHS = {
    "/jobbers/dead-letter-queue", "/jobbers/dead-letter-queue/{task_id}/history",
    "/jobbers/dead-letter-queue/resubmit", "/jobbers/dead-letter-queue/discard",
    "/jobbers/scheduled-tasks", "/jobbers/tasks/{task_id}", "/jobbers/tasks/{task_id}/cancel",
    "/jobbers/schema", "/jobbers/dead-letter-queue/resubmit-runs",
    "/jobbers/dead-letter-queue/resubmit-runs/{run_id}",
    "/jobbers/dead-letter-queue/resubmit-runs/{run_id}/{control}",
    "/jobbers/dead-letter-queue/set-aside",
    "/jobbers/workflows/{task_id}", "/jobbers/workflows/{task_id}/cancel",
    "/jobbers/workflows/{task_id}/resubmit",
    "/jobbers/periodic-tasks",
    "/jobbers/workers", "/jobbers/queues", "/jobbers/pauses", "/jobbers/pauses/pause",
    "/jobbers/pauses/resume", "/jobbers/rate-limits", "/jobbers/rate-limits/set",
    "/jobbers/tasks", "/jobbers/task-search", "/jobbers/failure-groups", "/jobbers/counts",
    "/jobbers/history", "/jobbers/alert-rules", "/jobbers/fair-shares",
}


def test_schema_is_served_and_documents_every_endpoint_without_warnings(staff):
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.validation import validate_schema

    GENERATOR_STATS.reset()
    response = login(staff).get(f"{API}/schema",
                                HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert (dict(GENERATOR_STATS._warn_cache), dict(GENERATOR_STATS._error_cache)) == ({}, {})
    schema = response.json()
    validate_schema(schema)
    assert set(schema["paths"]) == ALL_PATHS
    paths = schema["paths"]
    assert set(paths["/jobbers/dead-letter-queue/resubmit"]) == {"post"}
    resubmit = paths["/jobbers/dead-letter-queue/resubmit"]["post"]
    assert resubmit["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ResubmitRequest")
    assert {"200", "400", "403"} <= set(resubmit["responses"])
    listing = paths["/jobbers/dead-letter-queue"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {
        "queue", "task_name", "task_version", "exception_type", "fingerprint", "reason",
        "status", "failed_after", "failed_before", "limit", "cursor", "ordering"}
    components = schema["components"]["schemas"]
    assert {"DeadLetterEntry", "DeadLetterPage", "ResubmitResult", "DiscardResult",
            "TaskDetail", "TaskRecord", "CancelResult", "FailureHistory",
            "ScheduledTasks", "Workflow", "WorkflowMember", "WorkflowTransition",
            "WorkflowCancelResult", "WorkflowResubmitResult",
            "WorkflowResubmitRequest"} <= set(components)
    for action in ("cancel", "resubmit"):
        answers = paths[f"/jobbers/workflows/{{task_id}}/{action}"]["post"]["responses"]
        assert {"200", "400", "401", "403", "404", "409"} <= set(answers)
    detail = paths["/jobbers/workflows/{task_id}"]["get"]
    assert {p["name"] for p in detail["parameters"]} == {"task_id"}


def test_project_wide_schema_generation_has_no_warnings():
    """A project generating one schema for all its APIs (``manage.py spectacular``)."""
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    GENERATOR_STATS.reset()
    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert (dict(GENERATOR_STATS._warn_cache), dict(GENERATOR_STATS._error_cache)) == ({}, {})
    assert set(schema["paths"]) == ALL_PATHS


def test_schema_needs_no_rest_framework_setting():
    """A project whose ``DEFAULT_SCHEMA_CLASS`` is DRF's own (no ``REST_FRAMEWORK`` at all):
    the decorators run at import time, so this takes a fresh process."""
    code = textwrap.dedent("""
        import json, os, django
        import tests.django.settings as settings
        del settings.REST_FRAMEWORK
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.settings"
        django.setup()
        from rest_framework.settings import api_settings
        assert api_settings.DEFAULT_SCHEMA_CLASS.__module__ == "rest_framework.schemas.openapi"
        from django.contrib.auth.models import AnonymousUser
        from drf_spectacular.drainage import GENERATOR_STATS
        from rest_framework.test import APIRequestFactory, force_authenticate
        from jobbers_django.api.schema import SchemaView
        request = APIRequestFactory().get("/jobbers/schema?format=json")
        force_authenticate(request, type("Viewer", (AnonymousUser,), {
            "is_authenticated": True, "is_active": True, "is_staff": True,
            "has_perm": lambda self, perm: perm == "jobbers.view_deadletterentry"})())
        response = SchemaView.as_view()(request)
        response.render()
        assert response.status_code == 200, response.content
        assert not GENERATOR_STATS._warn_cache and not GENERATOR_STATS._error_cache
        print(json.dumps(sorted(json.loads(response.content)["paths"])))
    """)
    env = subprocess_env({"JOBBERS_TEST_REDIS_URL": "redis://127.0.0.1:1/1"})
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) == ALL_PATHS


def test_anonymous_cannot_read_the_schema():
    assert Client().get(f"{API}/schema").status_code == 401
