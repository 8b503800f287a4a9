"""The admin's workflow page (``deadletterentry/live/workflow/<id>/``): state, the bar of k
of n, elapsed, the blocking member highlighted, members linking to their task pages,
history; Cancel workflow and Resubmit failed members behind a confirmation page
(permission-checked, CSRF); the link from a member's task page; every hostile id.
PostgreSQL and the session's private Redis."""

from __future__ import annotations

import html
from typing import Any

import pytest
import redis
from celery import group
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery import TaskState, printable
from jobbers_django.models import Action, DeadLetterAudit, DeadLetterEntry, Source, Status
from tests.conftest import free_port
from tests.django.test_hostile_ids import HOSTILE
from tests.django.workflow_helpers import SECRET, FakeWorkflows, chord_workflow

pytestmark = pytest.mark.django_db
S = TaskState


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, jobbers: Any) -> FakeWorkflows:
    return FakeWorkflows(chord_workflow(), cancel=["hdr-3"],
                         resubmit=["hdr-2"]).install(monkeypatch, jobbers)


def page_of(task_id: str) -> str:
    return reverse("admin:jobbers_workflow", args=[task_id])


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_page_shows_state_progress_blocking_members_and_history(fake, client, staff):
    client.force_login(staff)
    response = client.get(page_of("hdr-3"))
    assert response.status_code == 200
    assert fake.calls == [("workflow", "hdr-3", 1000)]
    text = response.content.decode()
    assert "<title>Workflow grp-1 |" in text
    assert 'id="jobbers-wf-state">running</strong>' in text
    assert "<strong>1 of 4 completed</strong>, 1 failed, 1 running" in text
    assert 'aria-label="1 of 4 completed"' in text
    for name in ("completed", "failed", "running", "pending"):  # one segment each
        assert f'class="jobbers-wf-{name}"' in text
    assert 'class="jobbers-wf-cancelled"' not in text  # none cancelled: no segment
    assert '<td id="jobbers-wf-elapsed">1m 15s <span class="muted">(running)</span>' in text
    # the blocking member: named in the header, its row highlighted and marked
    blocking = text[text.index('id="jobbers-wf-blocking"'):]
    assert blocking.index(f'href="{reverse("admin:jobbers_task", args=["hdr-2"])}"') < 80
    rows = text[text.index('id="jobbers-wf-members"'):text.index('id="jobbers-wf-history"')]
    assert rows.count('class="jobbers-blocking"') == 1
    assert '<tr class="jobbers-blocking" title="blocks the workflow" data-task-id="hdr-2"' \
        in rows
    for task_id in ("hdr-1", "hdr-2", "hdr-3"):
        assert f'href="{reverse("admin:jobbers_task", args=[task_id])}"' in rows
    assert 'aria-valuenow="75"' in rows  # hdr-3's progress, 3 of 4, as a bar
    assert SECRET not in text  # its progress and hdr-2's error are redacted
    assert "ValueError" in rows
    history = text[text.index('id="jobbers-wf-history"'):]
    assert "member shop.import_part[hdr-2] failed" in history
    # the group is no task: named, not linked
    assert "<th scope=\"row\">group</th><td><code>grp-1</code>" in text
    # a running workflow refreshes itself; a viewer sees no action
    assert 'id="jobbers-refresh-on"' in text
    assert "Cancel workflow…" not in text
    assert "Resubmit failed members…" not in text


def test_an_operator_sees_the_actions(fake, client, operator):
    client.force_login(operator)
    text = client.get(page_of("hdr-3")).content.decode()
    assert f'href="{reverse("admin:jobbers_workflow_cancel", args=["hdr-3"])}"' in text
    assert f'href="{reverse("admin:jobbers_workflow_resubmit", args=["hdr-3"])}"' in text


def test_an_unknown_workflow_and_an_unreachable_redis_are_messages(monkeypatch, jobbers,
                                                                   client, staff):
    FakeWorkflows(None).install(monkeypatch, jobbers)
    client.force_login(staff)
    missing = client.get(page_of("nope"))
    assert missing.status_code == 404  # as the API: tests/django/test_admin_no_task.py
    assert "No workflow has this id" in missing.content.decode()
    monkeypatch.undo()
    monkeypatch.setattr(jobbers.store, "client", redis.Redis(
        port=free_port(), retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.2))
    down = client.get(page_of("any"))
    assert down.status_code == 200
    assert "Redis is unreachable" in down.content.decode()


def test_reading_and_acting_need_their_permissions(fake, client, staff, outsider,
                                                   django_user_model):
    blind = django_user_model.objects.create_user("blind", password="pw", is_staff=True)
    urls = [page_of("hdr-3"), reverse("admin:jobbers_workflow_cancel", args=["hdr-3"]),
            reverse("admin:jobbers_workflow_resubmit", args=["hdr-3"])]
    for user in (blind, staff):
        client.force_login(user)
        expected = [403, 403, 403] if user is blind else [200, 403, 403]
        assert [client.get(u).status_code for u in urls] == expected
        assert [client.post(u, {"terminate": "0"}).status_code for u in urls[1:]] == [403, 403]
    client.force_login(outsider)  # not staff: the admin's login page
    assert client.get(urls[0]).status_code == 302
    assert [c[0] for c in fake.calls] == ["workflow"]  # staff's read only


def test_cancel_asks_then_cancels_with_the_csrf_token(fake, operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    url = reverse("admin:jobbers_workflow_cancel", args=["hdr-3"])
    confirm = client.get(url)
    assert confirm.status_code == 200
    text = confirm.content.decode()
    assert "Cancel workflow <code>grp-1</code>, now <strong>running</strong>" in text
    assert 'name="terminate" value="1"' in text
    # listed: the member still running, not the finished ones
    listed = text[text.index("Members to cancel"):]
    assert "<code>hdr-3</code>" in listed
    assert "<code>hdr-2</code>" not in listed
    assert [c[0] for c in fake.calls] == ["workflow"]
    assert client.post(url, {"terminate": "0"}).status_code == 403  # no CSRF token
    token = confirm.cookies["csrftoken"].value
    done = client.post(url, {"terminate": "1", "csrfmiddlewaretoken": token})
    assert done.status_code == 302
    assert done["Location"] == page_of("hdr-3")
    assert ("cancel", "hdr-3", True) in fake.calls
    assert messages_of(done) == [("Workflow of hdr-3: 1 member cancelled, or asked to stop "
                                 "(a running one stops at its next heartbeat, or is "
                                 "terminated).")]
    audit = DeadLetterAudit.objects.get()
    assert (audit.action, audit.source, audit.acted_ids) == (Action.CANCEL, Source.ADMIN,
                                                             ["hdr-3"])


def test_resubmit_asks_then_resubmits_the_failed_members(fake, client, operator,
                                                         make_entries):
    make_entries(1, task_id="hdr-2")
    client.force_login(operator)
    url = reverse("admin:jobbers_workflow_resubmit", args=["hdr-3"])
    text = client.get(url).content.decode()
    listed = text[text.index("Members to resubmit"):]
    assert "<code>hdr-2</code>" in listed
    assert "<code>hdr-3</code>" not in listed
    done = client.post(url, {"reset_retry_count": "0"})
    assert done.status_code == 302
    assert ("resubmit", "hdr-3", False) in fake.calls
    assert messages_of(done) == ["Workflow of hdr-3: 1 member resubmitted (retry count kept)."]
    assert DeadLetterEntry.objects.get(task_id="hdr-2").status == Status.RESUBMITTED
    audit = DeadLetterAudit.objects.get()
    assert (audit.action, audit.source, audit.acted_ids, audit.reset_retry_count) == (
        Action.RESUBMIT, Source.ADMIN, ["hdr-2"], False)


def test_nothing_to_do_is_a_warning(monkeypatch, jobbers, client, operator):
    fake = FakeWorkflows(chord_workflow()).install(monkeypatch, jobbers)
    client.force_login(operator)
    cancel = client.post(reverse("admin:jobbers_workflow_cancel", args=["hdr-3"]))
    assert messages_of(cancel) == [("Workflow of hdr-3: nothing to cancel: every member has "
                                   "finished (or it is unknown).")]
    resubmit = client.post(reverse("admin:jobbers_workflow_resubmit", args=["hdr-3"]))
    assert messages_of(resubmit)[-1] == ("Workflow of hdr-3: nothing to resubmit: no member "
                                         "failed (or it is unknown).")
    assert [c[0] for c in fake.calls] == ["workflow", "cancel", "resubmit"]
    assert not DeadLetterAudit.objects.exists()


def test_who_may_act_without_reading_gets_no_members(fake, client, django_user_model):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("canceller", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="cancel_task"))
    client.force_login(user)
    text = client.get(reverse("admin:jobbers_workflow_cancel", args=["hdr-3"])
                      ).content.decode()
    assert "Its members are not shown" in text
    assert "shop.import_part" not in text
    assert fake.calls == []
    assert client.post(reverse("admin:jobbers_workflow_cancel", args=["hdr-3"])
                       ).status_code == 302
    assert fake.calls == [("workflow", "hdr-3", 1000), ("cancel", "hdr-3", False)]


def test_every_hostile_id_opens_its_workflow_page(fake, client, operator):
    client.force_login(operator)
    for task_id in HOSTILE.values():
        url = page_of(task_id)
        page = client.get(url)
        assert page.status_code == 200, task_id
        assert page.context["task_id"] == task_id
        cancel = reverse("admin:jobbers_workflow_cancel", args=[task_id])
        assert f'href="{cancel}"' in page.content.decode()
        confirm = client.get(cancel).content.decode()
        assert f"Workflow of {html.escape(printable(task_id))}" in confirm
        assert client.post(cancel).status_code == 302
        for shown in (page.content.decode(), confirm):
            assert not {"\x1b", "\u202e", "\x07", "\r"} & set(shown)
    assert [c[1] for c in fake.calls if c[0] == "cancel"] == list(HOSTILE.values())


# ---------------------------------------------------------------------- real canvases
def test_a_members_task_page_links_its_workflow(djapp, jobbers, client, staff, make_entries):
    result = group(djapp.flaky_import.s("wf-a"), djapp.flaky_import.s("wf-b")).apply_async()
    member = result.results[0].id
    alone = djapp.flaky_import.apply_async(("alone",)).id
    client.force_login(staff)
    task_page = client.get(reverse("admin:jobbers_task", args=[member])).content.decode()
    assert f'href="{page_of(member)}"' in task_page
    assert "jobbers-task-workflow" not in client.get(
        reverse("admin:jobbers_task", args=[alone])).content.decode()
    page = client.get(page_of(member))
    text = page.content.decode()
    assert page.context["wf"]["flow"].root_id == result.id
    assert "<strong>0 of 2 completed</strong>, 0 failed, 0 running" in text
    for r in result.results:
        assert f'href="{reverse("admin:jobbers_task", args=[r.id])}"' in text
    # its dead-letter entry's page too (a chord it holds is repaired from the workflow)
    make_entries(1, task_id=member)
    (alone_entry,) = make_entries(1, task_id=alone)
    entry = DeadLetterEntry.objects.get(task_id=member)
    entry_page = client.get(reverse("admin:jobbers_deadletterentry_change", args=[entry.pk]))
    assert 'id="jobbers-entry-workflow">Workflow</a>' in entry_page.content.decode()
    assert f'href="{page_of(member)}"' in entry_page.content.decode()
    other = DeadLetterEntry.objects.get(task_id=alone_entry)
    assert "jobbers-entry-workflow" not in client.get(reverse(
        "admin:jobbers_deadletterentry_change", args=[other.pk])).content.decode()
