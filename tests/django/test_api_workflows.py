"""``/jobbers/workflows/{task_id}`` (and ``/cancel``, ``/resubmit``): a canvas as one unit
through the REST API. How a workflow is shown (counts, members, blocking, redaction,
history) on a workflow as ``Jobbers.workflow`` answers it; real canvases published through
the Django-sink app (their records in the session's private Redis, PostgreSQL for the dead
letters and the audit); permissions, 400s, 404s, 409s and hostile ids."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

import pytest
from celery import group
from django.test import Client
from django.urls import resolve, reverse
from hypothesis import given

from jobbers_celery import TaskState
from jobbers_django.api.serializers.fields import TASK_ID_MAX_LENGTH
from jobbers_django.models import Action, DeadLetterAudit, DeadLetterEntry, Source, Status
from tests.django.api_helpers import API, assert_bad, login, post
from tests.django.test_hostile_ids import ANY_ID, HOSTILE, api_path
from tests.django.workflow_helpers import SECRET, FakeWorkflows, chord_workflow
from tests.integration.store_helpers import step_kwargs

pytestmark = pytest.mark.django_db
S = TaskState


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, jobbers: Any) -> FakeWorkflows:
    return FakeWorkflows(chord_workflow(), cancel=["hdr-3"],
                         resubmit=["hdr-2"]).install(monkeypatch, jobbers)


# ---------------------------------------------------------------------- how it is shown
def test_a_workflow_with_its_counts_members_blocking_and_history(fake, staff):
    answer = login(staff).get(f"{API}/workflows/hdr-3")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert fake.calls == [("workflow", "hdr-3", 1000)]
    assert (body["task_id"], body["root_id"], body["state"]) == ("hdr-3", "grp-1", "running")
    assert body["progress"] == "1 of 4 completed"
    assert {k: body[k] for k in ("total", "completed", "failed", "running", "pending",
                                 "cancelled")} == {"total": 4, "completed": 1, "failed": 1,
                                                   "running": 1, "pending": 1, "cancelled": 0}
    assert (body["started_at"], body["ended_at"]) == ("2026-11-26T15:00:00.000Z", None)
    assert body["elapsed_seconds"] == 75.0
    assert body["blocking"] == ["hdr-2"]
    assert body["truncated"] is False
    members = body["members"]
    assert [(m["task_id"], m["role"], m["group_id"], m["parent_id"], m["blocking"])
            for m in members] == [("hdr-1", "header", "grp-1", None, False),
                                  ("hdr-2", "header", "grp-1", None, True),
                                  ("hdr-3", "header", "grp-1", None, False)]
    assert [m["elapsed_seconds"] for m in members] == [3.0, 3.0, 74.0]  # running: to now
    assert [m["record"]["state"] for m in members] == ["completed", "failed", "started"]
    assert members[2]["record"]["progress"]["done"] == 3
    assert SECRET not in answer.content.decode()  # progress and error redacted
    assert members[1]["record"]["error"]["type"] == "ValueError"
    assert [(h["state"], h["task_id"]) for h in body["history"]] == [
        ("running", "hdr-1"), ("running", "hdr-2")]
    assert body["history"][1]["reason"] == "member shop.import_part[hdr-2] failed"
    assert body["history"][0]["at"] == "2026-11-26T15:00:00.000Z"


def test_query_parameters_are_refused(fake, staff):
    client = login(staff)
    for query in ("limit=2", "state=failed"):
        assert_bad(client.get(f"{API}/workflows/hdr-3?{query}"), query.split("=")[0])
    assert fake.calls == []


def test_an_unknown_workflow_is_a_404(monkeypatch, jobbers, operator):
    fake = FakeWorkflows(None).install(monkeypatch, jobbers)
    client = login(operator)
    for answer in (client.get(f"{API}/workflows/nope"),
                   post(client, "workflows/nope/cancel", {}),
                   post(client, "workflows/nope/resubmit", {})):
        assert answer.status_code == 404, answer.content
        assert answer.json()["detail"].startswith("no workflow has the id nope")
    assert [c[0] for c in fake.calls] == ["workflow"] * 3  # nothing acted on


def test_only_an_id_over_the_bound_is_a_400(fake, operator):
    client = login(operator)
    long_id = "x" * (TASK_ID_MAX_LENGTH + 1)
    assert_bad(client.get(f"{API}/workflows/{long_id}"), "task_id")
    assert_bad(post(client, f"workflows/{long_id}/cancel", {}), "task_id")
    assert_bad(post(client, f"workflows/{long_id}/resubmit", {}), "task_id")
    assert client.get(f"{API}/workflows/{'x' * TASK_ID_MAX_LENGTH}").status_code == 200
    assert fake.calls == [("workflow", "x" * TASK_ID_MAX_LENGTH, 1000)]


def test_bodies_are_strict(fake, operator):
    client = login(operator)
    assert_bad(post(client, "workflows/hdr-3/cancel", {"terminate": "maybe"}), "terminate")
    assert_bad(post(client, "workflows/hdr-3/cancel", {"terminat": True}), "terminat")
    assert_bad(post(client, "workflows/hdr-3/resubmit", {"reset_retry_count": "x"}),
               "reset_retry_count")
    assert_bad(post(client, "workflows/hdr-3/resubmit", {"version": "current"}), "version")
    assert_bad(post(client, "workflows/hdr-3/resubmit", [1]), "body")
    assert [c for c in fake.calls if c[0] != "workflow"] == []


# ---------------------------------------------------------------------- actions
def test_cancel_answers_the_members_cancelled_and_is_audited(fake, operator):
    answer = post(login(operator), "workflows/hdr-3/cancel", {"terminate": True})
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"task_id": "hdr-3", "root_id": "grp-1", "cancelled": ["hdr-3"],
                             "state": "running", "terminate": True}
    assert ("cancel", "hdr-3", True) in fake.calls
    audit = DeadLetterAudit.objects.get()
    assert (audit.action, audit.source, audit.user, audit.task_ids, audit.acted_ids,
            audit.acted, audit.detail) == (Action.CANCEL, Source.API, operator, ["hdr-3"],
                                           ["hdr-3"], 1, "workflow")


def test_nothing_to_cancel_or_resubmit_is_a_409_and_not_audited(monkeypatch, jobbers,
                                                                 operator):
    FakeWorkflows(chord_workflow()).install(monkeypatch, jobbers)
    client = login(operator)
    cancel = post(client, "workflows/hdr-3/cancel", {})
    assert cancel.status_code == 409
    assert cancel.json()["cancelled"] == []
    resubmit = post(client, "workflows/hdr-3/resubmit", {"reset_retry_count": False})
    assert resubmit.status_code == 409
    assert (resubmit.json()["resubmitted"], resubmit.json()["reset_retry_count"]) == ([], False)
    assert not DeadLetterAudit.objects.exists()


def test_an_ended_workflow_is_not_cancelled(monkeypatch, jobbers, operator):
    """Cancelling what has ended changes nothing (its state stays what it was)."""
    import dataclasses

    from jobbers_celery import WorkflowState

    ended = dataclasses.replace(chord_workflow(), state=WorkflowState.COMPLETED)
    fake = FakeWorkflows(ended, cancel=["never"]).install(monkeypatch, jobbers)
    answer = post(login(operator), "workflows/hdr-3/cancel", {})
    assert answer.status_code == 409
    assert (answer.json()["cancelled"], answer.json()["state"]) == ([], "completed")
    assert [c[0] for c in fake.calls] == ["workflow"] * 3  # read, never cancelled
    assert not DeadLetterAudit.objects.exists()


def test_resubmit_marks_the_members_dead_letters_and_audits(fake, operator, make_entries):
    make_entries(1, task_id="hdr-2")
    (other,) = make_entries(1)
    answer = post(login(operator), "workflows/hdr-3/resubmit", {})
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"task_id": "hdr-3", "root_id": "grp-1", "resubmitted": ["hdr-2"],
                             "state": "running", "reset_retry_count": True}
    assert ("resubmit", "hdr-3", True) in fake.calls
    entry = DeadLetterEntry.objects.get(task_id="hdr-2")
    assert (entry.status, entry.resubmit_count, entry.publish_pending) == (
        Status.RESUBMITTED, 1, False)
    assert entry.resubmitted_at is not None
    assert DeadLetterEntry.objects.get(task_id=other).status == Status.DEAD
    audit = DeadLetterAudit.objects.get()
    assert (audit.action, audit.source, audit.task_ids, audit.acted_ids,
            audit.reset_retry_count) == (Action.RESUBMIT, Source.API, ["hdr-3"], ["hdr-2"],
                                         True)


def test_an_id_ending_in_an_action_is_read_with_get_and_acted_on_with_post(fake, operator):
    client = login(operator)
    assert client.get(f"{API}/workflows/a/cancel").json()["task_id"] == "a/cancel"
    assert client.get(f"{API}/workflows/a/resubmit").json()["task_id"] == "a/resubmit"
    assert post(client, "workflows/a/cancel", {}).json()["task_id"] == "a"
    assert post(client, "workflows/a/resubmit", {}).json()["task_id"] == "a"
    assert [c for c in fake.calls if c[0] != "workflow"] == [("cancel", "a", False),
                                                            ("resubmit", "a", True)]


# ---------------------------------------------------------------------- permissions
def test_reading_needs_the_read_rule_and_acting_its_own_rule(fake, staff, operator,
                                                             outsider, django_user_model):
    from django.contrib.auth.models import Permission

    anonymous = Client()
    assert anonymous.get(f"{API}/workflows/hdr-3").status_code == 401
    assert post(anonymous, "workflows/hdr-3/cancel", {}).status_code == 401
    for user in (outsider, django_user_model.objects.create_user("blind", password="pw",
                                                                 is_staff=True)):
        client = login(user)
        refused = client.get(f"{API}/workflows/hdr-3")
        assert refused.status_code == 403
        assert "jobbers.view_deadletterentry" in refused.json()["detail"]
        assert post(client, "workflows/hdr-3/cancel", {}).status_code == 403
        assert post(client, "workflows/hdr-3/resubmit", {}).status_code == 403
    viewer = login(staff)  # reads, may not act
    assert viewer.get(f"{API}/workflows/hdr-3").status_code == 200
    assert "JOBBERS_CANCEL_PERMISSION" in post(viewer, "workflows/hdr-3/cancel",
                                               {}).json()["detail"]
    assert "JOBBERS_RESUBMIT_PERMISSION" in post(viewer, "workflows/hdr-3/resubmit",
                                                 {}).json()["detail"]
    assert [c[0] for c in fake.calls] == ["workflow"]  # only the one read got through
    canceller = django_user_model.objects.create_user("canceller", password="pw")
    canceller.user_permissions.add(Permission.objects.get(codename="cancel_task"))
    only_cancel = login(canceller)
    assert only_cancel.get(f"{API}/workflows/hdr-3").status_code == 403
    assert post(only_cancel, "workflows/hdr-3/cancel", {}).status_code == 200
    assert post(only_cancel, "workflows/hdr-3/resubmit", {}).status_code == 403
    assert post(login(operator), "workflows/hdr-3/resubmit", {}).status_code == 200


def test_a_session_post_needs_its_csrf_token(fake, operator):
    client = login(operator, enforce_csrf_checks=True)
    assert post(client, "workflows/hdr-3/cancel", {}).status_code == 403
    assert post(client, "workflows/hdr-3/resubmit", {}).status_code == 403
    assert [c[0] for c in fake.calls] == []


# ---------------------------------------------------------------------- hostile ids
def test_every_hostile_id_reaches_the_workflow_as_given(fake, operator):
    client = login(operator)
    for task_id in HOSTILE.values():
        answer = client.get(f"{API}/workflows/{api_path(task_id)}")
        assert answer.status_code == 200, (task_id, answer.content)
        assert answer.json()["task_id"] == task_id
        assert post(client, f"workflows/{api_path(task_id)}/cancel",
                    {}).json()["task_id"] == task_id
        assert post(client, f"workflows/{api_path(task_id)}/resubmit",
                    {}).json()["task_id"] == task_id
    asked = [c[1] for c in fake.calls if c[0] != "workflow"]
    assert asked == [i for task_id in HOSTILE.values() for i in (task_id, task_id)]


# ---------------------------------------------------------------------- real canvases
def test_a_group_published_here_is_one_workflow(djapp, jobbers, staff, operator):
    """A group of two published by this process (no worker): both members recorded under
    the group, pending; one fails (as a worker would record it), then is resubmitted
    through the API and its dead letter follows."""
    result = group(djapp.flaky_import.s("wf-a"), djapp.flaky_import.s("wf-b")).apply_async()
    first, second = (r.id for r in result.results)
    body = login(staff).get(f"{API}/workflows/{second}").json()
    assert (body["root_id"], body["state"], body["total"], body["pending"]) == (
        result.id, "running", 2, 2)
    assert {m["task_id"] for m in body["members"]} == {first, second}
    assert {m["group_id"] for m in body["members"]} == {result.id}
    # the same workflow from the group's id
    assert login(staff).get(f"{API}/workflows/{result.id}").json()["root_id"] == result.id

    for to in (S.STARTED, S.FAILED):  # as a worker records them
        assert jobbers.store.step(first, to, **step_kwargs(to)).applied
    failed = login(staff).get(f"{API}/workflows/{first}").json()
    assert (failed["failed"], failed["blocking"]) == (1, [first])
    client = login(operator)
    resubmitted = post(client, f"workflows/{first}/resubmit", {})
    assert resubmitted.status_code == 200, resubmitted.content
    assert resubmitted.json()["resubmitted"] == [first]
    assert jobbers.get(first).state is S.SUBMITTED
    cancelled = post(client, f"workflows/{first}/cancel", {})
    assert cancelled.status_code == 200, cancelled.content
    assert set(cancelled.json()["cancelled"]) == {first, second}
    after = login(staff).get(f"{API}/workflows/{first}").json()
    assert (after["state"], after["cancelled"]) == ("cancelled", 2)
    assert post(client, f"workflows/{first}/cancel", {}).status_code == 409


@given(ANY_ID)
def test_any_id_resolves_on_the_workflow_routes(task_id: str) -> None:
    """The API's percent-encoded paths and the admin's readable form: any id Celery runs
    comes back as it was (an id ending in /cancel or /resubmit: the method decides)."""
    for suffix, name in (("/cancel", "workflow-cancel"), ("/resubmit", "workflow-resubmit")):
        found = resolve(unquote(f"{API}/workflows/{api_path(task_id)}{suffix}",
                                errors="surrogatepass"))
        assert (found.url_name, found.kwargs) == (name, {"task_id": task_id})
    if not task_id.endswith(("/cancel", "/resubmit")):
        detail = resolve(unquote(f"{API}/workflows/{api_path(task_id)}",
                                 errors="surrogatepass"))
        assert (detail.url_name, detail.kwargs) == ("workflow-detail", {"task_id": task_id})
    for name in ("admin:jobbers_workflow", "admin:jobbers_workflow_cancel",
                 "admin:jobbers_workflow_resubmit"):
        url = reverse(name, args=[task_id])
        assert url == quote(url, safe="/:@+~")
        assert resolve(unquote(url)).kwargs == {"task_id": task_id}
