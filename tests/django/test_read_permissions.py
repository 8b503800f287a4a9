"""Reading needs the view permission: a staff account without jobbers permissions reads no
dead letter, task record, group, audit row or paced run, through the API or the admin; the
view permission of the model opens each; a user who may only cancel gets the confirmation
page without the task's record. PostgreSQL and the session's private Redis."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from jobbers_django import runs
from jobbers_django.models import DeadLetterEntry, FailureGroup
from jobbers_django.services import Selection
from tests.django.api_helpers import API, login

pytestmark = pytest.mark.django_db

#: What the record of the task shows (its name, its state): never on a page of a user
#: without the view permission.
TASK_NAME = "djproj.flaky_import"


@pytest.fixture
def world(djapp: Any, make_entries: Any, operator: Any) -> dict[str, Any]:
    """A dead letter whose task also has a live record, its group, and a paced run."""
    (task_id,) = make_entries(1)
    djapp.flaky_import.apply_async(("catalog",), task_id=task_id)
    run = runs.start(Selection(task_ids=(task_id,)), runs.Pace(1), user=operator)
    entry = DeadLetterEntry.objects.get(task_id=task_id)
    group = FailureGroup.objects.get(fingerprint=entry.fingerprint)
    return {"id": task_id, "pk": entry.pk, "run": run.pk, "group": group.pk}


def api_reads(w: dict[str, Any]) -> dict[str, str]:
    """Every GET endpoint, by the model it reads."""
    return {
        "dead-letter-queue": "deadletterentry",
        f"dead-letter-queue/{w['id']}/history": "deadletterentry",
        f"tasks/{w['id']}": "deadletterentry",
        f"workflows/{w['id']}": "deadletterentry",
        "scheduled-tasks": "deadletterentry",
        "schema": "deadletterentry",
        "dead-letter-queue/set-aside": "deadletterentry",
        "workers": "deadletterentry",
        "queues": "deadletterentry",
        "pauses": "deadletterentry",
        "dead-letter-queue/resubmit-runs": "resubmitrun",
        f"dead-letter-queue/resubmit-runs/{w['run']}": "resubmitrun",
    }


def admin_pages(w: dict[str, Any]) -> dict[str, str]:
    """Every admin page that shows a record, by the model whose view permission opens it."""
    return {
        reverse("admin:jobbers_deadletterentry_changelist"): "deadletterentry",
        reverse("admin:jobbers_deadletterentry_change", args=[w["pk"]]): "deadletterentry",
        reverse("admin:jobbers_live"): "deadletterentry",
        reverse("admin:jobbers_task", args=[w["id"]]): "deadletterentry",
        reverse("admin:jobbers_workflow", args=[w["id"]]): "deadletterentry",
        reverse("admin:jobbers_set_aside"): "deadletterentry",
        reverse("admin:jobbers_workers"): "deadletterentry",
        reverse("admin:jobbers_failuregroup_changelist"): "failuregroup",
        reverse("admin:jobbers_deadletteraudit_changelist"): "deadletteraudit",
        reverse("admin:jobbers_resubmitrun_changelist"): "resubmitrun",
        reverse("admin:jobbers_resubmitrun_change", args=[w["run"]]): "resubmitrun",
    }


def staff_with(django_user_model: Any, name: str, *codenames: str) -> Any:
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="jobbers", codename__in=codenames))
    return user


def refused(client: Client, urls: list[str]) -> list[str]:
    """The urls that did not answer 403."""
    return [f"{u} {r.status_code}" for u in urls if (r := client.get(u)).status_code != 403]


def test_staff_without_a_jobbers_permission_reads_nothing(world, django_user_model):
    blind = login(staff_with(django_user_model, "blind"))
    reads = [f"{API}/{path}" for path in api_reads(world)]
    assert refused(blind, [*reads, *admin_pages(world)]) == []
    body = blind.get(f"{API}/dead-letter-queue").json()
    assert "jobbers.view_deadletterentry" in body["detail"]
    assert TASK_NAME not in str(body)
    # the cancel confirmation page: neither cancel nor view
    assert blind.get(reverse("admin:jobbers_cancel", args=[world["id"]])).status_code == 403


@pytest.mark.parametrize("model", ["deadletterentry", "failuregroup", "deadletteraudit",
                                   "resubmitrun"])
def test_each_view_permission_opens_its_own_reads_only(world, django_user_model, model):
    client = login(staff_with(django_user_model, f"sees-{model}", f"view_{model}"))
    everything = {**{f"{API}/{p}": m for p, m in api_reads(world).items()},
                  **admin_pages(world)}
    mine = [url for url, m in everything.items() if m == model]
    assert mine
    assert [f"{u} {r.status_code}" for u in mine
            if (r := client.get(u)).status_code != 200] == []
    assert refused(client, [url for url, m in everything.items() if m != model]) == []


def test_who_may_start_runs_may_watch_them_and_read_nothing_else(world, django_user_model):
    client = login(staff_with(django_user_model, "resubmitter", "resubmit_deadletter"))
    everything = {**{f"{API}/{p}": m for p, m in api_reads(world).items()},
                  **admin_pages(world)}
    runs_pages = [url for url, m in everything.items() if m == "resubmitrun"]
    assert all(client.get(u).status_code == 200 for u in runs_pages)
    assert refused(client, [url for url, m in everything.items() if m != "resubmitrun"]) == []


def test_the_cancel_page_shows_the_record_only_to_who_may_view_it(world, django_user_model,
                                                                  operator, jobbers):
    url = reverse("admin:jobbers_cancel", args=[world["id"]])
    canceller = login(staff_with(django_user_model, "canceller", "cancel_task"))
    page = canceller.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    assert f"Cancel task <code>{world['id']}</code>" in text
    assert TASK_NAME not in text
    assert "<strong>submitted</strong>" not in text  # its state
    assert "jobbers-lifecycle" not in text
    assert refused(canceller, [f"{API}/tasks/{world['id']}"]) == []
    # and cancelling still works without seeing
    assert canceller.post(url, {"terminate": "0"}).status_code == 302
    assert jobbers.get(world["id"]).state.value == "cancelled"

    seen = login(operator).get(url).content.decode()  # view and cancel: the record
    assert TASK_NAME in seen
    assert "jobbers-lifecycle" in seen


def test_the_read_rule_is_a_setting(world, django_user_model, settings):
    blind = login(staff_with(django_user_model, "blind"))
    settings.JOBBERS_READ_PERMISSION = "staff"  # the old default: any staff reads
    reads = [f"{API}/{path}" for path in api_reads(world)]
    assert [u for u in [*reads, *admin_pages(world)] if blind.get(u).status_code != 200] == []
    settings.JOBBERS_READ_PERMISSION = "superuser"
    assert refused(blind, [*reads, *admin_pages(world)]) == []
    settings.JOBBERS_READ_PERMISSION = "jobbers.cancel_task"  # one permission for all reads
    reader = login(staff_with(django_user_model, "odd", "cancel_task"))
    assert [u for u in reads if reader.get(u).status_code != 200] == []
