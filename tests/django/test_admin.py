"""The jobbers admin: changelist (filters, search, bounded counts), groups, detail (failure
history and lifecycle), actions behind confirmation pages and permissions, live tasks and
cancel, read-only pages, redaction. PostgreSQL and the session's private Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery import TaskState
from jobbers_django import admin as jobbers_admin
from jobbers_django import services
from jobbers_django.models import DeadLetterAudit, DeadLetterEntry, FailureGroup, Status
from jobbers_django.sink import write_entry
from tests.conftest import free_port
from tests.django.conftest import dead_letter
from tests.integration.store_helpers import put_in_state

pytestmark = pytest.mark.django_db

S = TaskState
CHANGELIST = "admin:jobbers_deadletterentry_changelist"
SECRET = "hunter2"  # conftest's kwargs password; must never reach a page


@pytest.fixture(autouse=True)
def _redis(djapp: Any) -> None:
    """Every page may read Redis: the private one, flushed per test."""


def changelist(client: Any, **params: Any) -> Any:
    response = client.get(reverse(CHANGELIST), params)
    assert response.status_code == 200, response
    return response


def listed(response: Any) -> set[str]:
    return {e.task_id for e in response.context["cl"].result_list}


def entry(task_id: str) -> DeadLetterEntry:
    return DeadLetterEntry.objects.get(task_id=task_id)


def post_action(client: Any, action: str, ids: list[str], query: str = "",
                **extra: Any) -> Any:
    pks = [entry(i).pk for i in ids]
    return client.post(reverse(CHANGELIST) + query,
                       {"action": action, "_selected_action": pks, **extra})


def confirm(client: Any, page: Any, **choice: str) -> Any:
    """Press a button of a confirmation page: post back its hidden fields, as a browser."""
    assert page.status_code == 200, page
    data: dict[str, list[str]] = {}
    for name, value in page.context["hidden"]:
        data.setdefault(name, []).append(str(value))
    return client.post(page.context["back_url"], {**data, "post": "yes", **choice})


def unreachable() -> redis.Redis:
    """A client of a port nothing listens on, failing at once (no retries)."""
    return redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))


def message_texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# ---------------------------------------------------------------------- changelist
def test_changelist_filters_and_search(client, staff, make_entries):
    default = make_entries(3)
    other = make_entries(2, name="djproj.other", version=2, queue="slow", reason="stalled",
                         exception_type="builtins.KeyError", exception_message="'sku' missing")
    DeadLetterEntry.objects.filter(task_id=default[0]).update(status=Status.DISCARDED)
    client.force_login(staff)

    assert listed(changelist(client)) == {*default, *other}
    assert listed(changelist(client, task_name="djproj.other")) == set(other)
    assert listed(changelist(client, task_version="2")) == set(other)
    assert listed(changelist(client, queue="slow")) == set(other)
    assert listed(changelist(client, reason="stalled")) == set(other)
    assert listed(changelist(client, exception_type="builtins.ValueError")) == set(default)
    assert listed(changelist(client, status="discarded")) == {default[0]}
    assert listed(changelist(client, last_failed_at__gte="2026-01-01 00:00:00+00:00",
                             last_failed_at__lt="2027-01-01 00:00:00+00:00")) == {*default, *other}
    assert listed(changelist(client, last_failed_at__gte="2027-01-01 00:00:00+00:00")) == set()
    bad = client.get(reverse(CHANGELIST), {"task_version": "two"})
    assert bad.status_code == 302
    assert bad["Location"].endswith("?e=1")
    assert listed(changelist(client, q=other[1])) == {other[1]}            # id: exact
    assert listed(changelist(client, q="'SKU' MISS")) == set(other)          # message
    assert listed(changelist(client, q="row")) == set(default)
    assert listed(changelist(client, q="catalog-42", reason="failed")) == set(default)

    # the choices come from the failure groups; the text filters render as inputs
    page = changelist(client).content.decode()
    assert "?task_name=djproj.other" in page
    assert "?exception_type=builtins.KeyError" in page
    assert 'name="queue"' in page
    assert 'name="task_version"' in page


def test_changelist_never_counts_or_scans_the_whole_table(client, operator, make_entries,
                                                          monkeypatch):
    make_entries(7)
    monkeypatch.setattr(jobbers_admin.BoundedPaginator, "cap", 5)
    client.force_login(operator)
    with CaptureQueriesContext(connection) as queries:
        response = changelist(client, q="upstream")
    sql = [q["sql"] for q in queries.captured_queries]
    entries = [s for s in sql if '"jobbers_deadletterentry"' in s]
    assert not any("DISTINCT" in s for s in entries), entries
    assert any("COUNT(*)" in s and "LIMIT 6" in s for s in entries), entries
    assert not any("COUNT(*)" in s and "LIMIT" not in s for s in entries), entries
    page = response.content.decode()
    assert "more than 5 dead-letter entries" in page
    assert "more than 5 results" in page
    assert "Select all matching dead-letter entries (more than 5)" in page


def test_groups_page_links_to_the_group_entries(client, staff, make_entries):
    ids = make_entries(3)
    odd = make_entries(1, exception_type="builtins.KeyError", exception_message="'sku'")
    client.force_login(staff)
    response = client.get(reverse("admin:jobbers_failuregroup_changelist"))
    assert response.status_code == 200
    groups = {g.exception_type: g for g in response.context["cl"].result_list}
    assert (groups["builtins.ValueError"].failures, groups["builtins.ValueError"].dead) == (3, 3)
    page = response.content.decode()
    fp = entry(ids[0]).fingerprint
    assert f"?fingerprint={fp}" in page
    assert f"?fingerprint={fp}&amp;status=dead" in page
    assert "upstream rejected row &lt;n&gt; of catalog-&lt;n&gt;" in page  # normalised
    assert "shop/imports.py:flaky_import" in page

    listing = changelist(client, fingerprint=fp)
    assert listed(listing) == set(ids)
    assert listed(changelist(client, fingerprint=entry(odd[0]).fingerprint)) == set(odd)
    assert "By failure group" in listing.content.decode()


# ---------------------------------------------------------------------- detail
def test_detail_shows_failure_history_and_transitions(client, staff, jobbers):
    first = dead_letter(attempt=1, exception_message="first failure")
    write_entry(first)
    write_entry(dead_letter(first.task_id, attempt=2, retry_attempt=1, reason="stalled",
                            exception_type=None, exception_message="no heartbeat for 61s",
                            traceback=None, failed_at=first.failed_at.replace(hour=5)))
    row = entry(first.task_id)
    assert jobbers.resubmit_dead_letters([services.to_dead_letter(row)]) == [first.task_id]
    client.force_login(staff)

    response = client.get(reverse("admin:jobbers_deadletterentry_change", args=[row.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    history = page[page.index('id="jobbers-failures"'):page.index('id="jobbers-lifecycle"')]
    assert history.index("first failure") < history.index("no heartbeat for 61s")
    assert "<details><summary>traceback</summary>" in history
    lifecycle = page[page.index('id="jobbers-lifecycle"'):]
    assert "<strong>submitted</strong>" in lifecycle
    assert "resubmitted (retry count reset) from the dead-letter queue" in lifecycle
    assert f"?fingerprint={row.fingerprint}" in page  # the group link
    assert "Resubmit…" not in page  # view-only user: no action buttons


def test_detail_without_redis_record_or_redis(client, operator, make_entries, jobbers,
                                              monkeypatch):
    [task_id] = make_entries(1)
    client.force_login(operator)
    url = reverse("admin:jobbers_deadletterentry_change", args=[entry(task_id).pk])
    page = client.get(url).content.decode()
    assert "There is no record of this task in Redis any more" in page
    assert "Resubmit…" in page
    assert "Discard…" in page

    monkeypatch.setattr(jobbers.store, "client", unreachable())
    response = client.get(url)
    assert response.status_code == 200
    assert "Redis is unreachable, so the lifecycle cannot be shown" in response.content.decode()


# ---------------------------------------------------------------------- actions
def test_view_only_staff_gets_no_action_and_a_refused_post(client, staff, make_entries,
                                                           published):
    ids = make_entries(2)
    client.force_login(staff)
    page = changelist(client).content.decode()
    assert "resubmit_selected" not in page
    assert "discard_selected" not in page
    for action in ("resubmit_selected", "discard_selected"):
        assert post_action(client, action, ids).status_code == 403
        assert post_action(client, action, ids, post="yes",
                           task_ids=json.dumps(ids)).status_code == 403
    assert set(DeadLetterEntry.objects.values_list("status", flat=True)) == {Status.DEAD}
    assert published == []
    assert not DeadLetterAudit.objects.exists()


def test_permission_rule_is_configurable(client, operator, make_entries, settings):
    ids = make_entries(1)
    settings.JOBBERS_RESUBMIT_PERMISSION = "superuser"
    client.force_login(operator)
    assert "resubmit_selected" not in changelist(client).content.decode()
    assert post_action(client, "resubmit_selected", ids, post="yes",
                       task_ids=json.dumps(ids)).status_code == 403
    assert entry(ids[0]).status == Status.DEAD


def test_resubmit_confirms_then_resubmits(client, operator, make_entries, published,
                                          jobbers, django_capture_on_commit_callbacks):
    ids = make_entries(4)
    services.discard(services.Selection(task_ids=(ids[3],)))
    client.force_login(operator)

    confirm_page = post_action(client, "resubmit_selected", ids, index="0")  # changelist's Go
    assert confirm_page.status_code == 200
    page = confirm_page.content.decode()
    assert "Resubmit 3 dead-letter entries?" in page
    assert "1 of the selected entry is not dead" in page
    assert all(i in page for i in ids[:3])
    assert ids[3] not in page
    assert 'name="reset_retry_count" value="1"' in page
    assert 'name="reset_retry_count" value="0"' in page
    assert published == []
    assert entry(ids[0]).status == Status.DEAD

    with django_capture_on_commit_callbacks(execute=True):
        done = confirm(client, confirm_page, reset_retry_count="1")
    assert done.status_code == 302
    assert {i: entry(i).status for i in ids} == {
        **dict.fromkeys(ids[:3], Status.RESUBMITTED), ids[3]: Status.DISCARDED}
    assert sorted(published) == sorted(ids[:3])
    assert all(jobbers.get(i).state == S.SUBMITTED for i in ids[:3])
    audit = DeadLetterAudit.objects.get(action="resubmit")
    assert (audit.source, audit.action, audit.username, audit.reset_retry_count,
            audit.acted) == ("admin", "resubmit", "operator", True, 3)
    assert sorted(audit.acted_ids) == sorted(ids[:3])
    [text] = message_texts(done)
    assert text.startswith("Resubmitted 3 dead-letter entries (retry count reset)")
    assert FailureGroup.objects.get().dead == 0


@pytest.mark.django_db(transaction=True)
def test_resubmit_keeping_the_retry_count(client, operator, make_entries, published, jobbers):
    ids = make_entries(2, retry_attempt=2, attempt=3)
    client.force_login(operator)
    done = confirm(client, post_action(client, "resubmit_selected", ids), reset_retry_count="0")
    assert done.status_code == 302
    assert sorted(published) == sorted(ids)
    assert [jobbers.get(i).retry_attempt for i in ids] == [2, 2]
    audit = DeadLetterAudit.objects.get()
    assert audit.reset_retry_count is False
    assert message_texts(done) == [
        "Resubmitted 2 dead-letter entries (retry count kept): 2 published."]


@pytest.mark.django_db(transaction=True)
def test_resubmit_as_the_current_version(client, operator, make_entries, published, jobbers,
                                         version_two):
    ids = make_entries(2, version=1)
    client.force_login(operator)
    page = post_action(client, "resubmit_selected", ids)
    text = page.content.decode()
    assert 'name="version" value="entry" checked' in text
    assert 'name="version" value="current"' in text
    assert "djproj.flaky_import v2" in text  # what "current" means here
    assert "v1" in text  # each entry's own version
    done = confirm(client, page, reset_retry_count="1", version="current")
    assert done.status_code == 302
    assert sorted(published) == sorted(ids)
    assert [jobbers.get(i).version for i in ids] == [2, 2]
    audit = DeadLetterAudit.objects.get()
    assert (audit.version, audit.versions) == ("current", {"djproj.flaky_import": 2})
    assert message_texts(done) == [
        ("Resubmitted 2 dead-letter entries (retry count reset, as the current version): "
         "2 published.")]
    listed_audit = client.get(reverse("admin:jobbers_deadletteraudit_changelist"))
    assert "the current version" in listed_audit.content.decode()


def test_resubmit_as_the_current_version_of_an_unknown_task_changes_nothing(
        client, operator, make_entries, published):
    ids = make_entries(1, name="djproj.retired")
    client.force_login(operator)
    done = confirm(client, post_action(client, "resubmit_selected", ids), version="current")
    assert done.status_code == 302
    [text] = message_texts(done)
    assert text.startswith("Nothing was resubmitted: cannot resubmit as the current version: "
                           "djproj.retired is not registered")
    assert entry(ids[0]).status == Status.DEAD
    assert published == []
    assert not DeadLetterAudit.objects.exists()


def test_discard_confirms_then_discards(client, operator, make_entries, published):
    ids = make_entries(3)
    client.force_login(operator)
    confirm_page = post_action(client, "discard_selected", ids[:2])
    assert "Discard 2 dead-letter entries?" in confirm_page.content.decode()
    done = confirm(client, confirm_page)
    assert done.status_code == 302
    assert [entry(i).status for i in ids] == [Status.DISCARDED, Status.DISCARDED, Status.DEAD]
    assert published == []
    audit = DeadLetterAudit.objects.get()
    assert (audit.action, audit.source, audit.acted) == ("discard", "admin", 2)
    assert message_texts(done) == ["Discarded 2 dead-letter entries."]
    assert FailureGroup.objects.get().dead == 1
    # discarding again: nothing is dead any more
    again = post_action(client, "discard_selected", ids[:2])
    assert again.status_code == 302
    assert "Nothing to discard" in message_texts(again)[-1]


def test_select_across_takes_the_filtered_dead_entries_it_listed(client, operator,
                                                                  make_entries):
    slow = make_entries(3, queue="slow")
    make_entries(2)
    client.force_login(operator)
    page = post_action(client, "discard_selected", slow[:1], query="?queue=slow",
                       select_across="1")
    assert "Discard 3 dead-letter entries?" in page.content.decode()
    late = make_entries(1, queue="slow")  # fails after the page was shown: not confirmed
    done = confirm(client, page)
    assert message_texts(done) == ["Discarded 3 dead-letter entries."]
    assert set(DeadLetterEntry.objects.filter(status=Status.DISCARDED)
               .values_list("task_id", flat=True)) == set(slow)
    assert entry(late[0]).status == Status.DEAD


def test_confirming_entries_taken_meanwhile_reports_them_skipped(client, operator,
                                                                 make_entries):
    ids = make_entries(3)
    client.force_login(operator)
    page = post_action(client, "discard_selected", ids)
    services.discard(services.Selection(task_ids=(ids[0],)))  # someone else, meanwhile
    done = confirm(client, page)
    assert message_texts(done) == [
        "Discarded 2 dead-letter entries; 1 skipped (1 status is discarded)."]


def test_a_thousand_entries_confirm_in_one_field(client, operator, make_entries):
    """More than Django's 1,000 POST fields if each id were a field of its own."""
    from jobbers_django.models import DeadLetterEntry as Entry

    ids = make_entries(1)
    fields = {f.attname: getattr(entry(ids[0]), f.attname)
              for f in Entry._meta.concrete_fields if f.name != "id"}
    Entry.objects.bulk_create([Entry(**fields | {"task_id": f"bulk-{n}"}) for n in range(1100)])
    client.force_login(operator)
    page = post_action(client, "discard_selected", ids, select_across="1")
    assert "Discard 1000 dead-letter entries?" in page.content.decode()
    assert "one action takes at most 1000" in " ".join(page.content.decode().split())
    confirm(client, page)
    assert Entry.objects.filter(status=Status.DISCARDED).count() == 1000


def test_entries_are_read_only(client, django_user_model, make_entries):
    [task_id] = make_entries(1)
    admin = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    pk = entry(task_id).pk
    page = changelist(client).content.decode()
    assert reverse("admin:jobbers_deadletterentry_add") not in page
    assert client.get(reverse("admin:jobbers_deadletterentry_add")).status_code == 403
    change = reverse("admin:jobbers_deadletterentry_change", args=[pk])
    assert 'name="_save"' not in client.get(change).content.decode()
    assert client.post(change, {"task_name": "x"}).status_code == 403
    assert client.post(reverse("admin:jobbers_deadletterentry_delete", args=[pk]),
                       {"post": "yes"}).status_code == 403
    assert "delete_selected" not in page
    assert entry(task_id).task_name == "djproj.flaky_import"
    for name in ("failuregroup", "deadletteraudit"):
        assert client.get(reverse(f"admin:jobbers_{name}_add")).status_code == 403


def test_outsider_is_sent_to_login(client, outsider):
    client.force_login(outsider)
    for url in (reverse(CHANGELIST), reverse("admin:jobbers_live")):
        response = client.get(url)
        assert response.status_code == 302
        assert "/login/" in response["Location"]


# ---------------------------------------------------------------------- live tasks
@pytest.fixture
def live_tasks(jobbers: Any) -> dict[str, str]:
    store, name = jobbers.store, "djproj.flaky_import"
    [*_, started] = put_in_state(store, "run-1", S.STARTED, name=name, queue="celery")
    store.heartbeat("run-1", started.attempt,
                    progress=json.dumps({"done": 3, "token": SECRET}), name=name)
    put_in_state(store, "stall-1", S.STALLED, name=name, queue="celery")
    put_in_state(store, "sched-1", S.SCHEDULED, name=name, queue="celery")
    return {"running": "run-1", "stalled": "stall-1", "scheduled": "sched-1"}


def test_live_page_shows_counts_running_stalled_scheduled(client, staff, live_tasks):
    client.force_login(staff)
    response = client.get(reverse("admin:jobbers_live"))
    assert response.status_code == 200
    counts = dict(response.context["counts"])
    assert (counts["started"], counts["stalled"], counts["scheduled"]) == (1, 1, 1)
    page = response.content.decode()
    running = page[page.index('id="jobbers-running"'):page.index('id="jobbers-stalled"')]
    assert "run-1" in running
    assert "w1@<wbr>host" in running  # may wrap after its @ (jobbers_name)
    assert "ago" in running
    assert "done: 3, token: ********" in running  # no whole: readable text, redacted
    assert "********" in running
    assert "stall-1" in page[page.index('id="jobbers-stalled"'):]
    scheduled = page[page.index('id="jobbers-scheduled"'):page.index('id="jobbers-cleaner"')]
    assert "sched-1" in scheduled
    assert "No cleaner pass has run yet." in page
    assert "Cancel…" not in page  # staff may not cancel

    task_page = client.get(reverse("admin:jobbers_task", args=["run-1"])).content.decode()
    assert "<strong>started</strong>" in task_page
    assert "Cancel…" not in task_page
    app_index = client.get(reverse("admin:app_list", args=["jobbers"])).content.decode()
    assert reverse("admin:jobbers_live") in app_index


def test_cancel_needs_the_permission_and_a_confirmation(client, staff, operator, live_tasks,
                                                        jobbers):
    url = reverse("admin:jobbers_cancel", args=["sched-1"])
    client.force_login(staff)
    assert client.get(url).status_code == 403
    assert client.post(url, {"terminate": "0"}).status_code == 403
    assert jobbers.get("sched-1").state == S.SCHEDULED

    client.force_login(operator)
    assert "Cancel…" in client.get(reverse("admin:jobbers_live")).content.decode()
    confirm = client.get(url).content.decode()
    assert "Cancel task <code>sched-1</code>" in confirm
    assert 'value="1"' not in confirm
    assert jobbers.get("sched-1").state == S.SCHEDULED
    done = client.post(url, {"terminate": "0"})
    assert done.status_code == 302
    assert done["Location"] == reverse("admin:jobbers_live")
    assert jobbers.get("sched-1").state == S.CANCELLED
    audit = DeadLetterAudit.objects.get()
    assert (audit.action, audit.source, audit.acted_ids) == ("cancel", "admin", ["sched-1"])

    running = reverse("admin:jobbers_cancel", args=["run-1"])
    assert 'name="terminate" value="1"' in client.get(running).content.decode()
    client.post(running, {"terminate": "1"})
    assert "cancel" in " ".join(message_texts(client.get(reverse("admin:jobbers_live"))))
    finished = client.post(reverse("admin:jobbers_cancel", args=["stall-1"]))
    assert "was not cancelled" in message_texts(finished)[0]


def test_live_page_when_redis_is_unreachable(client, staff, jobbers, monkeypatch):
    monkeypatch.setattr(jobbers.store, "client", unreachable())
    client.force_login(staff)
    response = client.get(reverse("admin:jobbers_live"))
    assert response.status_code == 200
    assert "Redis is unreachable" in response.content.decode()


# ---------------------------------------------------------------------- audit, secrets
def test_audit_page_lists_actions(client, operator, make_entries):
    ids = make_entries(2)
    client.force_login(operator)
    confirm(client, post_action(client, "discard_selected", ids))
    response = client.get(reverse("admin:jobbers_deadletteraudit_changelist"))
    assert response.status_code == 200
    [row] = response.context["cl"].result_list
    assert (row.action, row.username, row.acted) == ("discard", "operator", 2)


def test_secrets_never_reach_a_page(client, operator, make_entries, live_tasks,
                                    django_capture_on_commit_callbacks):
    ids = make_entries(2, options={"queue": "celery",
                                   "headers": {"Authorization": f"Bearer {SECRET}"}},
                       checkpoint={"row": 17, "api_key": SECRET})
    client.force_login(operator)
    pk = entry(ids[0]).pk
    pages = [
        changelist(client),
        client.get(reverse("admin:jobbers_deadletterentry_change", args=[pk])),
        client.get(reverse("admin:jobbers_failuregroup_changelist")),
        client.get(reverse("admin:jobbers_live")),
        client.get(reverse("admin:jobbers_task", args=["run-1"])),
        client.get(reverse("admin:jobbers_cancel", args=["run-1"])),
        post_action(client, "resubmit_selected", ids),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        confirm(client, pages[-1])
    pages += [client.get(reverse("admin:jobbers_deadletteraudit_changelist")),
              client.get(reverse("admin:jobbers_task", args=[ids[0]])),
              client.get(reverse("admin:jobbers_deadletterentry_change", args=[pk]))]
    for response in pages:
        assert response.status_code == 200, response
        assert SECRET not in response.content.decode(), response.request["PATH_INFO"]
    detail = pages[1].content.decode()
    assert detail.count("********") >= 3  # kwargs password, checkpoint api_key, header
    assert entry(ids[0]).kwargs["password"] == SECRET  # stored whole for the resubmit


def test_a_big_payload_is_cut_on_its_page_and_resubmitted_whole(
        client, operator, make_entries, published, jobbers,
        django_capture_on_commit_callbacks):
    from jobbers_celery.lifecycle import payload

    big = "x" * 2_000_000
    # big_import(key, data): the second parameter is no secret (flaky_import's is: password)
    [task_id] = make_entries(1, name="djproj.big_import", args=["catalog-42", big])
    client.force_login(operator)
    detail = client.get(reverse("admin:jobbers_deadletterentry_change",
                                args=[entry(task_id).pk]))
    assert detail.status_code == 200
    page = detail.content.decode()
    assert len(page) < 100_000  # not the 2 MB argument
    assert "catalog-42" in page
    assert "[cut for display: 2,000,000 characters in all]" in page
    assert "resubmission uses the full value" in page

    # the list shows no argument: its query does not read them
    with CaptureQueriesContext(connection) as queries:
        listing = changelist(client)
    assert len(listing.content) < 100_000
    rows = '"jobbers_deadletterentry"."task_name"'  # a query that reads entry rows
    selects = [q["sql"] for q in queries.captured_queries
               if q["sql"].startswith("SELECT") and rows in q["sql"]]
    assert selects
    assert not any('"jobbers_deadletterentry"."args"' in s for s in selects), selects

    with django_capture_on_commit_callbacks(execute=True):
        confirm(client, post_action(client, "resubmit_selected", [task_id]))
    assert published == [task_id]
    msg = payload.loads(jobbers.store.client.hget(jobbers.store.keys_of(task_id).task(task_id), "msg"))
    assert msg["args"] == ["catalog-42", big]
