"""The REST API's actions: resubmit and discard (by ids, by filters, dry run, validation
that changes nothing, concurrent requests) and cancel.

Tests that check ``published`` in the answer run with a transactional database: in a
test transaction ``transaction.on_commit`` would wait for the test's own commit.
"""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import pytest
import redis
from django.db import connection
from django.test import Client

from jobbers_celery import TaskState
from jobbers_django.models import DeadLetterAudit, DeadLetterEntry, Status
from tests.django.api_helpers import API, assert_bad, login, post, snapshot

pytestmark = pytest.mark.django_db

S = TaskState


def broker(redis_url: str) -> list[dict[str, Any]]:
    """The messages waiting in the ``celery`` queue: headers and decoded body."""
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.lrange("celery", 0, -1)
    finally:
        client.close()
    messages = []
    for item in raw:
        message = json.loads(item)
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs, _ = json.loads(body)
        messages.append({"id": message["headers"]["id"], "task": message["headers"]["task"],
                         "args": args, "kwargs": kwargs})
    return messages


def fail_in_jobbers(jobbers: Any, djapp: Any, task_id: str) -> None:
    """Give a dead-lettered task a ``failed`` record, as a worker would have."""
    djapp.flaky_import.apply_async(("catalog-42",), {"password": "hunter2"}, task_id=task_id)
    assert jobbers.store.step(task_id, S.STARTED, start=True, worker="w1@host").applied
    assert jobbers.store.step(task_id, S.FAILED).applied


def everything(redis_url: str, published: list[str]) -> tuple[Any, ...]:
    return snapshot(), len(broker(redis_url)), list(published)


# ---------------------------------------------------------------------- resubmit
@pytest.mark.django_db(transaction=True)
def test_resubmit_by_ids_publishes_after_commit_even_with_atomic_requests(
        make_entries, operator, jobbers, djapp, published, redis_url, monkeypatch):
    # ATOMIC_REQUESTS would hold the on_commit publish until after the answer: the view
    # opts out, so the answer lists what went out
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    ids = make_entries(3)
    for task_id in ids:
        fail_in_jobbers(jobbers, djapp, task_id)
    published.clear()
    response = post(login(operator), "dead-letter-queue/resubmit",
                    {"task_ids": [*ids, "not-in-the-dlq"]})
    assert response.status_code == 200, response.content
    body = response.json()
    assert sorted(body["resubmitted"]) == sorted(body["published"]) == sorted(ids)
    assert sorted(published) == sorted(ids)
    assert (body["matched"], body["more"], body["dry_run"]) == (3, False, False)
    assert body["skipped"] == [{"task_id": "not-in-the-dlq",
                                "why": "not in the dead-letter queue"}]
    assert {row["status"] for row in body["sample"]} == {"resubmitted"}
    assert all(row["kwargs"]["password"] == "********" for row in body["sample"])
    audit = DeadLetterAudit.objects.get(pk=body["audit_id"])
    assert (audit.source, audit.action, audit.username, sorted(audit.acted_ids)) == (
        "api", "resubmit", "operator", sorted(ids))
    assert audit.reset_retry_count is True
    assert (audit.version, audit.versions) == ("entry", None)  # the default
    for task_id in ids:
        entry = DeadLetterEntry.objects.get(task_id=task_id)
        assert (entry.status, entry.resubmit_count, entry.publish_pending) == (
            Status.RESUBMITTED, 1, False)
        assert jobbers.get(task_id).state is S.SUBMITTED
        last = jobbers.history(task_id)[-1]
        assert (last.from_state, last.to_state) == (S.FAILED, S.SUBMITTED)
        assert last.reason == "resubmitted (retry count reset) from the dead-letter queue"
    # the real arguments went to the broker, redacted only in the answer
    messages = {m["id"]: m for m in broker(redis_url)}
    assert all(messages[i]["kwargs"]["password"] == "hunter2" for i in ids)
    assert "hunter2" not in response.content.decode()
    # a second request finds nothing dead and publishes nothing
    again = post(login(operator), "dead-letter-queue/resubmit", {"task_ids": ids}).json()
    assert (again["resubmitted"], again["published"]) == ([], [])
    assert {s["why"] for s in again["skipped"]} == {"status is resubmitted"}
    assert sorted(published) == sorted(ids)


@pytest.mark.django_db(transaction=True)
def test_resubmit_by_filters_takes_the_newest_up_to_limit(
        make_entries, operator, jobbers, published, redis_url):
    target = make_entries(5, name="djproj.flaky_import", queue="imports")
    others = make_entries(2, name="djproj.flaky_import", queue="celery")
    response = post(login(operator), "dead-letter-queue/resubmit",
                    {"task_name": "djproj.flaky_import", "queue": "imports", "limit": 3,
                     "reset_retry_count": False})
    body = response.json()
    assert response.status_code == 200, body
    assert (body["matched"], body["more"], body["skipped"]) == (3, True, [])
    assert body["resubmitted"] == target[:1:-1]  # newest first
    assert sorted(body["published"]) == sorted(published) == sorted(target[2:])
    statuses = dict(DeadLetterEntry.objects.values_list("task_id", "status"))
    assert [statuses[i] for i in target] == ["dead", "dead", *["resubmitted"] * 3]
    assert {statuses[i] for i in others} == {"dead"}
    audit = DeadLetterAudit.objects.get(pk=body["audit_id"])
    assert audit.filters == {"task_name": "djproj.flaky_import", "queue": "imports"}
    assert (audit.limit, audit.reset_retry_count, audit.task_ids) == (3, False, None)
    # created records (the originals had expired): submitted, with the entry's payload
    record = jobbers.get(target[-1])
    assert (record.state, record.name, record.queue) == (S.SUBMITTED, "djproj.flaky_import",
                                                         "imports")
    assert jobbers.history(target[-1])[-1].reason == "resubmitted from the dead-letter queue"
    assert len(broker(redis_url)) == 3


def test_dry_run_answers_count_and_sample_and_changes_nothing(
        make_entries, operator, published, redis_url):
    ids = make_entries(12, queue="imports")
    make_entries(2, queue="celery")
    before = everything(redis_url, published)
    client = login(operator)
    body = post(client, "dead-letter-queue/resubmit",
                {"queue": "imports", "dry_run": True, "limit": 1000}).json()
    assert (body["dry_run"], body["matched"], body["more"]) == (True, 12, False)
    assert (body["resubmitted"], body["published"], body["audit_id"]) == ([], [], None)
    assert [row["task_id"] for row in body["sample"]] == ids[::-1][:10]
    assert body["sample"][0]["kwargs"] == {"password": "********", "region": "eu"}
    assert {row["status"] for row in body["sample"]} == {"dead"}
    capped = post(client, "dead-letter-queue/resubmit",
                  {"queue": "imports", "dry_run": True, "limit": 5}).json()
    assert (capped["matched"], capped["more"]) == (5, True)
    by_ids = post(client, "dead-letter-queue/resubmit",
                  {"task_ids": [ids[0], "gone"], "dry_run": True}).json()
    assert by_ids["matched"] == 1
    assert by_ids["skipped"] == [{"task_id": "gone", "why": "not in the dead-letter queue"}]
    discard = post(client, "dead-letter-queue/discard",
                   {"queue": "imports", "dry_run": True}).json()
    assert (discard["matched"], discard["discarded"], discard["audit_id"]) == (12, [], None)
    assert everything(redis_url, published) == before


@pytest.mark.django_db(transaction=True)
def test_resubmit_as_the_current_version(make_entries, operator, jobbers, djapp, published,
                                         redis_url, version_two):
    ids = make_entries(2, version=1)
    for task_id in ids:
        fail_in_jobbers(jobbers, djapp, task_id)
    published.clear()
    response = post(login(operator), "dead-letter-queue/resubmit",
                    {"task_ids": ids, "version": "current"})
    body = response.json()
    assert response.status_code == 200, body
    assert sorted(body["published"]) == sorted(ids)
    audit = DeadLetterAudit.objects.get(pk=body["audit_id"])
    assert (audit.version, audit.versions) == ("current", {"djproj.flaky_import": 2})
    headers = _headers(redis_url)
    for task_id in ids:
        assert jobbers.get(task_id).version == 2
        assert headers[task_id]["jobbers_version"] == 2
        assert jobbers.history(task_id)[-1].reason == (
            "resubmitted (retry count reset) from the dead-letter queue as the current "
            "version 2 (the entry's was 1)")


def _headers(redis_url: str) -> dict[str, dict[str, Any]]:
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.lrange("celery", 0, -1)
    finally:
        client.close()
    return {h["id"]: h for h in (json.loads(item)["headers"] for item in raw)}


def test_resubmit_as_the_current_version_of_an_unknown_task_is_a_400(
        make_entries, operator, published, redis_url):
    ids = make_entries(1, name="djproj.retired")  # this process does not register it
    make_entries(1)
    before = everything(redis_url, published)
    client = login(operator)
    for body in ({"task_ids": ids, "version": "current"},
                 {"task_name": "djproj.retired", "version": "current", "dry_run": True},
                 {"queue": "celery", "version": "current"}):
        response = post(client, "dead-letter-queue/resubmit", body)
        assert_bad(response, "version")
        assert "djproj.retired is not registered as a JobbersTask" in response.json()[
            "errors"]["version"][0]
    assert everything(redis_url, published) == before
    # the entry's own version needs no registration
    assert post(client, "dead-letter-queue/resubmit",
                {"task_ids": ids, "dry_run": True}).json()["matched"] == 1


def test_entries_without_json_arguments_are_never_resubmitted(make_entries, operator,
                                                              published, redis_url):
    from jobbers_celery import UNPUBLISHABLE

    why = "its arguments were not recorded as JSON"
    [unusable] = make_entries(1, args=[], kwargs={}, options={UNPUBLISHABLE: why},
                              queue="refused")
    before = everything(redis_url, published)
    client = login(operator)
    by_id = post(client, "dead-letter-queue/resubmit", {"task_ids": [unusable]}).json()
    assert (by_id["matched"], by_id["resubmitted"]) == (0, [])
    assert by_id["skipped"] == [{"task_id": unusable,
                                 "why": f"cannot be published again: {why}"}]
    by_filter = post(client, "dead-letter-queue/resubmit", {"queue": "refused"}).json()
    assert (by_filter["matched"], by_filter["resubmitted"]) == (0, [])
    assert snapshot()[0] == before[0][0]
    assert published == []
    # it can still be discarded
    discarded = post(client, "dead-letter-queue/discard", {"task_ids": [unusable]}).json()
    assert discarded["discarded"] == [unusable]


_IDS = ["5f0c1b2a-aaaa-bbbb-cccc-0123456789ab"]


@pytest.mark.parametrize(("body", "field"), [
    ({"task_ids": [f"t{n}" for n in range(1001)]}, "task_ids"),
    ({"task_ids": []}, "task_ids"),
    ({}, "task_ids"),
    ({"reset_retry_count": True}, "task_ids"),
    ({"dry_run": True}, "task_ids"),
    ({"task_ids": _IDS, "colour": "blue"}, "colour"),
    ({"task_ids": _IDS, "args": ["x"]}, "args"),
    ({"task_ids": _IDS, "kwargs": {"a": 1}}, "kwargs"),
    ({"task_ids": _IDS, "name": "other.task"}, "name"),
    ({"task_ids": ["ok", "x" * 4097]}, "task_ids"),
    ({"task_ids": ["a\ud800"]}, "task_ids"),  # not UTF-8 ("../etc", "\n" are ids)
    ({"task_ids": [42]}, "task_ids"),
    ({"task_ids": "abc"}, "task_ids"),
    ({"task_ids": [None]}, "task_ids"),
    ({"queue": "celery", "limit": 0}, "limit"),
    ({"queue": "celery", "limit": -1}, "limit"),
    ({"queue": "celery", "limit": 10**9}, "limit"),
    ({"queue": "celery", "limit": "abc"}, "limit"),
    ({"queue": "celery", "limit": None}, "limit"),
    ({"task_ids": _IDS, "limit": 10}, "limit"),
    ({"task_ids": _IDS, "queue": "celery"}, "task_ids"),
    ({"queue": ""}, "queue"),
    ({"queue": None}, "queue"),
    ({"task_name": "x" * 256}, "task_name"),
    ({"queue": "celery", "status": "dead"}, "status"),
    ({"queue": "celery", "reason": "bored"}, "reason"),
    ({"queue": "celery", "task_version": "two"}, "task_version"),
    ({"failed_after": "yesterday"}, "failed_after"),
    ({"failed_before": "2026-02-30T00:00:00Z"}, "failed_before"),
    ({"failed_after": "2026-11-02T00:00:00Z", "failed_before": "2026-11-01T00:00:00Z"},
     "failed_before"),
    ({"queue": "celery", "dry_run": None}, "dry_run"),
    ({"queue": "celery", "dry_run": "perhaps"}, "dry_run"),
    ({"queue": "celery", "reset_retry_count": "perhaps"}, "reset_retry_count"),
    ({"queue": "celery", "version": "latest"}, "version"),
    ({"queue": "celery", "version": 2}, "version"),
    (["5f0c1b2a"], "body"),
])
@pytest.mark.parametrize("path", ["dead-letter-queue/resubmit", "dead-letter-queue/discard"])
def test_bad_action_bodies_are_400s_naming_the_field_and_change_nothing(
        make_entries, operator, published, redis_url, path, body, field):
    if path.endswith("discard") and "reset_retry_count" in body:
        field = "reset_retry_count"  # unknown there: still named, still a 400
    make_entries(3, queue="celery")
    make_entries(1, task_id=_IDS[0])
    before = everything(redis_url, published)
    response = post(login(operator), path, body)
    assert_bad(response, field)
    assert everything(redis_url, published) == before


@pytest.mark.parametrize("path", ["dead-letter-queue/resubmit", "dead-letter-queue/discard"])
def test_action_options_in_the_query_string_are_refused_not_ignored(
        make_entries, operator, published, redis_url, path):
    ids = make_entries(2)
    before = everything(redis_url, published)
    response = post(login(operator), f"{path}?dry_run=true", {"task_ids": ids})
    assert_bad(response, "dry_run")
    assert everything(redis_url, published) == before


def test_error_messages_name_the_field_and_the_index(make_entries, operator):
    body = post(login(operator), "dead-letter-queue/resubmit",
                {"task_ids": ["fine", "x" * 4097], "limit": 0}).json()
    assert body["detail"] == ("task_ids[1]: a task id is at most 4096 characters (any "
                              "characters); limit: must be between 1 and 1000")
    assert set(body["errors"]) == {"task_ids", "limit"}
    assert list(body["errors"]["task_ids"]) == ["1"]
    many = post(login(operator), "dead-letter-queue/resubmit",
                {"task_ids": [f"t{n}" for n in range(1001)]}).json()
    assert many["detail"] == "task_ids: at most 1000 ids per request"


def test_discard_by_ids_and_by_filters(make_entries, operator, published):
    kept = make_entries(2, queue="celery")
    by_ids = make_entries(2, queue="imports")
    by_filter = make_entries(3, queue="exports", reason="stalled")
    client = login(operator)
    body = post(client, "dead-letter-queue/discard", {"task_ids": by_ids}).json()
    assert sorted(body["discarded"]) == sorted(by_ids)
    assert {row["status"] for row in body["sample"]} == {"discarded"}
    body = post(client, "dead-letter-queue/discard",
                {"queue": "exports", "reason": "stalled", "limit": 2}).json()
    assert (body["matched"], body["more"], body["discarded"]) == (2, True, by_filter[:0:-1])
    audit = DeadLetterAudit.objects.get(pk=body["audit_id"])
    assert (audit.action, audit.source, audit.filters) == (
        "discard", "api", {"queue": "exports", "reason": "stalled"})
    statuses = dict(DeadLetterEntry.objects.values_list("task_id", "status"))
    assert [statuses[i] for i in kept + by_ids + by_filter] == [
        "dead", "dead", "discarded", "discarded", "dead", "discarded", "discarded"]
    # a discarded entry is never resubmitted
    again = post(client, "dead-letter-queue/resubmit", {"task_ids": by_ids}).json()
    assert (again["resubmitted"], published) == ([], [])
    assert {s["why"] for s in again["skipped"]} == {"status is discarded"}
    listed = client.get(f"{API}/dead-letter-queue?status=discarded").json()
    assert listed["count"] == 4


@pytest.mark.django_db(transaction=True)
def test_concurrent_resubmits_of_the_same_100_entries_publish_each_once(
        make_entries, operator, jobbers, published, redis_url):
    ids = make_entries(100)
    barrier = threading.Barrier(8)
    answers: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def resubmit() -> None:
        try:
            client = login(operator)
            barrier.wait()
            response = post(client, "dead-letter-queue/resubmit", {"task_ids": ids})
            assert response.status_code == 200, response.content
            answers.append(response.json())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=resubmit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(answers) == 8
    assert sorted(published) == sorted(ids)
    assert sorted(i for a in answers for i in a["published"]) == sorted(ids)
    assert sorted(i for a in answers for i in a["resubmitted"]) == sorted(ids)
    assert set(DeadLetterEntry.objects.values_list("resubmit_count", flat=True)) == {1}
    assert all(jobbers.get(i).state is S.SUBMITTED for i in ids)
    assert jobbers.counts()[S.SUBMITTED] == 100
    assert len(broker(redis_url)) == 100


# ---------------------------------------------------------------------- cancel
def test_cancel_a_submitted_task(djapp, jobbers, operator):
    djapp.flaky_import.apply_async(("catalog",), task_id="c-1")
    client = login(operator)
    response = post(client, "tasks/c-1/cancel", {})
    assert response.status_code == 200, response.content
    assert response.json() == {"task_id": "c-1", "cancelled": True, "outcome": "cancelled",
                               "state": "cancelled", "terminate": False}
    assert jobbers.get("c-1").state is S.CANCELLED
    audit = DeadLetterAudit.objects.get(action="cancel")
    assert (audit.source, audit.username, audit.acted_ids) == ("api", "operator", ["c-1"])
    # already finished: nothing to cancel, nothing audited
    again = post(client, "tasks/c-1/cancel", {})
    assert again.status_code == 409
    assert (again.json()["cancelled"], again.json()["outcome"]) == (False, "refused")
    assert DeadLetterAudit.objects.filter(action="cancel").count() == 1


def test_cancel_without_a_body_and_a_started_task(djapp, jobbers, operator):
    djapp.flaky_import.apply_async(("catalog",), task_id="c-2")
    assert jobbers.store.step("c-2", S.STARTED, start=True, worker="w1@host").applied
    client = login(operator)
    response = client.generic("POST", f"{API}/tasks/c-2/cancel")  # no body at all
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["cancelled"], body["outcome"], body["state"]) == (True, "requested",
                                                                   "started")
    djapp.flaky_import.apply_async(("catalog",), task_id="c-3")
    assert jobbers.store.step("c-3", S.STARTED, start=True, worker="w1@host").applied
    terminate = post(client, "tasks/c-3/cancel", {"terminate": True}).json()
    assert (terminate["outcome"], terminate["terminate"]) == ("requested", True)


def test_cancel_unknown_malformed_and_bad_bodies(djapp, jobbers, operator, staff):
    djapp.flaky_import.apply_async(("catalog",), task_id="c-4")
    client = login(operator)
    assert post(client, "tasks/nope/cancel", {}).status_code == 404
    assert post(client, "tasks/-x/cancel", {}).status_code == 404
    assert_bad(post(client, f"tasks/{'x' * 4097}/cancel", {}), "task_id")
    assert_bad(post(client, "tasks/c-4/cancel", {"terminate": "perhaps"}), "terminate")
    assert_bad(post(client, "tasks/c-4/cancel", {"reason": "because"}), "reason")
    assert_bad(post(client, "tasks/c-4/cancel", [True]), "body")
    assert_bad(post(client, "tasks/c-4/cancel?terminate=true", {}), "terminate")
    assert post(login(staff), "tasks/c-4/cancel", {}).status_code == 403
    assert post(Client(), "tasks/c-4/cancel", {}).status_code == 401
    assert jobbers.get("c-4").state is S.SUBMITTED
    assert not DeadLetterAudit.objects.exists()


@pytest.mark.parametrize("path", ["dead-letter-queue/resubmit", "dead-letter-queue/discard",
                                  "dead-letter-queue/resubmit-runs"])
def test_a_body_nested_too_deep_to_parse_is_a_400(make_entries, operator, published,
                                                  redis_url, path):
    """Python's JSON decoder raises RecursionError near 1,000 levels; DRF's parser let it
    through as a 500."""
    make_entries(2)
    before = everything(redis_url, published)
    response = login(operator).post(f"{API}/{path}", "[" * 5000 + "]" * 5000,
                                    content_type="application/json")
    assert response.status_code == 400, response.content
    assert "nested too deep" in response.json()["detail"]
    assert everything(redis_url, published) == before
