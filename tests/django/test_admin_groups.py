"""The admin's group and entry buttons (confirmation page, then the action, behind the
resubmit permission), the groups' hourly charts (one bounded query), the live page's
progress bars and chart, one date format per page, readable booleans and labels."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobbers_celery import CountSample, TaskState
from jobbers_django.admin import charts
from jobbers_django.models import DeadLetterAudit, DeadLetterEntry, FailureGroup, Status

pytestmark = pytest.mark.django_db

GROUPS = "admin:jobbers_failuregroup_changelist"
SECRET = "hunter2"  # conftest's kwargs password; must never reach a page
#: The one time format (core/timefmt.py), and what no page may show instead: Django's
#: DATETIME_FORMAT ("Nov. 1, 2026, midnight") or a time without its zone.
ONE_FORMAT = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[ \xa0]UTC")
OTHER_FORMAT = re.compile(r"[A-Z][a-z]{2}\.? \d{1,2}, \d{4}|[ap]\.m\.|midnight|noon"
                          r"|(?<![\d:])\d\d:\d\d:\d\d(?![\d.]|[ \xa0]UTC)")


@pytest.fixture(autouse=True)
def _redis(djapp: Any) -> None:
    """Every page may read Redis: the private one, flushed per test."""


def group_of(task_id: str) -> FailureGroup:
    return FailureGroup.objects.get(
        fingerprint=DeadLetterEntry.objects.get(task_id=task_id).fingerprint)


def test_group_buttons_need_the_resubmit_permission(client, staff, make_entries):
    ids = make_entries(2)
    group = group_of(ids[0])
    client.force_login(staff)
    page = client.get(reverse(GROUPS)).content.decode()
    assert "Resubmit…" not in page
    for name in ("resubmit", "discard"):
        url = reverse(f"admin:jobbers_failuregroup_{name}", args=[group.pk])
        assert client.get(url).status_code == 403
        assert client.post(url, {"post": "yes", "task_ids": f'["{ids[0]}"]'}).status_code == 403
    assert DeadLetterEntry.objects.filter(status=Status.DEAD).count() == 2


def test_a_group_is_resubmitted_from_its_confirmation_page(
        client, operator, make_entries, published, django_capture_on_commit_callbacks):
    ids = make_entries(3)
    other = make_entries(1, exception_type="builtins.KeyError", exception_message="'sku'")
    group = group_of(ids[0])
    DeadLetterEntry.objects.filter(task_id=ids[2]).update(status=Status.DISCARDED)
    client.force_login(operator)
    listing = client.get(reverse(GROUPS)).content.decode()
    url = reverse("admin:jobbers_failuregroup_resubmit", args=[group.pk])
    assert f'href="{url}"' in listing  # the row's button

    page = client.get(url)
    text = page.content.decode()
    assert page.context["count"] == 2  # the dead entries of the group, not the discarded one
    assert "Resubmit 2 dead-letter entries of the group djproj.flaky_import" in text
    assert 'id="jobbers-confirm-sample"' in text
    assert "upstream rejected row" in text  # the sample: message and arguments ...
    assert SECRET not in text  # ... redacted
    assert 'name="version" value="entry" checked' in text
    assert "csrfmiddlewaretoken" in text
    assert not published  # a GET changes nothing
    assert DeadLetterAudit.objects.count() == 0

    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(url, {"post": "yes", "reset_retry_count": "1", "version": "entry",
                                 "task_ids": page.context["hidden"][-1][1]})
    assert done.status_code == 302
    assert done["Location"] == reverse(GROUPS)
    assert sorted(published) == sorted(ids[:2])
    assert set(DeadLetterEntry.objects.filter(status=Status.RESUBMITTED)
               .values_list("task_id", flat=True)) == set(ids[:2])
    assert DeadLetterEntry.objects.get(task_id=other[0]).status == Status.DEAD
    audit = DeadLetterAudit.objects.get()
    assert (audit.action, audit.source, audit.acted) == ("resubmit", "admin", 2)
    messages = [str(m) for m in done.wsgi_request._messages]
    # (the test's transaction never commits: the message cannot say "2 published" here)
    assert messages[0].startswith("Resubmitted 2 dead-letter entries (retry count reset)")


def test_a_group_is_discarded_and_an_unknown_version_choice_is_refused(
        client, operator, make_entries):
    ids = make_entries(2)
    group = group_of(ids[0])
    client.force_login(operator)
    url = reverse("admin:jobbers_failuregroup_discard", args=[group.pk])
    page = client.get(url)
    assert page.context["count"] == 2
    assert 'name="version"' not in page.content.decode()  # no version for a discard
    bad = client.post(reverse("admin:jobbers_failuregroup_resubmit", args=[group.pk]),
                      {"post": "yes", "version": "latest", "task_ids": f'["{ids[0]}"]'})
    assert bad.status_code == 302
    assert "unknown version choice" in str(next(iter(bad.wsgi_request._messages)))
    client.post(url, {"post": "yes", "task_ids": page.context["hidden"][-1][1]})
    assert DeadLetterEntry.objects.filter(status=Status.DISCARDED).count() == 2
    assert client.get(reverse("admin:jobbers_failuregroup_resubmit", args=[999])
                      ).status_code == 404


def test_one_entry_is_resubmitted_from_its_page(client, operator, staff, make_entries,
                                                 published, django_capture_on_commit_callbacks):
    [task_id] = make_entries(1)
    pk = DeadLetterEntry.objects.get(task_id=task_id).pk
    url = reverse("admin:jobbers_deadletterentry_resubmit", args=[pk])
    client.force_login(staff)
    assert client.get(url).status_code == 403
    client.force_login(operator)
    detail = client.get(reverse("admin:jobbers_deadletterentry_change", args=[pk]))
    assert f'href="{url}"' in detail.content.decode()
    page = client.get(url)
    assert page.context["count"] == 1
    assert "Resubmit 1 dead-letter entry?" in page.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(url, {"post": "yes", "reset_retry_count": "0",
                                 "task_ids": f'["{task_id}"]'})
    assert done["Location"] == reverse("admin:jobbers_deadletterentry_change", args=[pk])
    assert published == [task_id]
    again = client.get(url)  # nothing dead any more: back to the entry, with a message
    assert again.status_code == 302
    assert any("Nothing to resubmit" in str(m) for m in again.wsgi_request._messages)


def test_groups_page_charts_come_from_one_bounded_query(client, staff, make_entries):
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    make_entries(1, failed_at=hour)  # this hour: the last bar
    make_entries(2, failed_at=hour - timedelta(hours=3) + timedelta(minutes=1))
    make_entries(1, failed_at=hour - timedelta(hours=30))  # older than the chart
    make_entries(1, exception_type="builtins.KeyError", exception_message="'sku'",
                 failed_at=hour - timedelta(hours=1))
    client.force_login(staff)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(GROUPS))
    same_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) == hour
    charted = [q["sql"] for q in queries if "jobbers_deadletterfailure" in q["sql"]]
    assert len(charted) == 1
    assert "GROUP BY" in charted[0]
    groups = {g.exception_type: g for g in response.context["cl"].result_list}
    hourly = groups["builtins.ValueError"].jobbers_hourly
    assert len(hourly) == charts.HOURS == 24
    assert sum(hourly) == 3
    if same_hour:  # (the hour did not turn during the request)
        assert (hourly[-1], hourly[-4]) == (1, 2)
    assert sum(groups["builtins.KeyError"].jobbers_hourly) == 1
    page = response.content.decode()
    assert page.count('class="jobbers-spark"') == 2
    assert "3 failures in the last 24 hours" in page


def test_hourly_failures_are_bounded_to_the_given_groups_and_hours(make_entries):
    now = datetime(2026, 11, 2, 12, 30, tzinfo=UTC)
    [a] = make_entries(1, failed_at=now - timedelta(minutes=20))
    fp = DeadLetterEntry.objects.get(task_id=a).fingerprint
    assert charts.hourly_failures([], now) == {}
    assert charts.hourly_failures(["nope"], now) == {"nope": [0] * 24}
    assert charts.hourly_failures([fp], now, hours=2) == {fp: [0, 1]}
    assert charts.hourly_failures([fp], now - timedelta(hours=3), hours=2) == {fp: [0, 0]}


@pytest.mark.parametrize(("value", "expected"), [
    ({"done": 3, "total": 10}, (0.3, "3 of 10 done")),
    ({"chunk": 11, "of": 60}, (11 / 60, "chunk 11 of 60")),  # the example project's shapes
    ({"batch": 51, "of": 400}, (51 / 400, "batch 51 of 400")),
    ({"percent": 50}, (0.5, "50%")),
    ({"fraction": 0.5}, (0.5, "50%")),
    ({"done": 12, "total": 10}, (1.0, "12 of 10 done")),
])
def test_progress_of_a_whole_is_a_bar(value, expected):
    found = charts.progress(value)
    assert (found.fraction, found.label) == (pytest.approx(expected[0]), expected[1])
    bar = charts.progress_bar(value)
    assert f'aria-valuenow="{int(100 * expected[0])}"' in bar
    assert f'aria-valuetext="{expected[1]}"' in bar


@pytest.mark.parametrize(("value", "label"), [
    (1, "1"),  # a counter (README's progress=1), never "100%"
    (0.25, "0.25"),
    (250, "250"),
    ({"done": 1, "total": 0}, "done: 1, total: 0"),
    ({"rows": 3}, "rows: 3"),
    (True, "true"),
    ("half <b>", "half &lt;b&gt;"),
])
def test_other_progress_is_readable_text_without_a_bar(value, label):
    assert charts.progress(value).fraction is None
    shown = str(charts.progress_bar(value))
    assert "progressbar" not in shown
    assert shown == f'<span class="jobbers-progress-label">{label}</span>'


def test_no_progress_shows_nothing():
    assert charts.progress(None) is None
    assert charts.progress_bar(None) is None


def test_state_charts_draw_one_line_per_state_on_three_scales():
    now = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
    samples = [CountSample(at=now - timedelta(minutes=m), counts={
        s: (1000 - m if s is TaskState.COMPLETED else m % 4) for s in TaskState})
        for m in range(59, -1, -1)]
    svg = str(charts.state_charts(samples, now))
    assert svg.count("<svg") == 3
    assert svg.count("<polyline") == 3 + 1 + 4  # every state of each panel
    assert "completed 1000" in svg
    assert charts.state_charts([], now) == ""


def test_live_page_shows_progress_bars_and_the_count_history(client, staff, jobbers):
    from tests.integration.store_helpers import put_in_state

    store = jobbers.store
    put_in_state(store, "p1", TaskState.STARTED)
    started = store.get("p1")
    store.heartbeat("p1", started.attempt, progress='{"done": 3, "total": 10}', name=started.name)
    put_in_state(store, "p2", TaskState.STARTED)
    store.heartbeat("p2", store.get("p2").attempt, progress='{"rows": 7}',
                    name=started.name)
    client.force_login(staff)
    page = client.get(reverse("admin:jobbers_live")).content.decode()
    assert 'aria-valuenow="30"' in page
    assert "3 of 10 done" in page
    assert ">rows: 7</span>" in page  # no whole: readable text, not JSON
    assert "No samples yet" in page
    assert "jobbers/live.js" in page
    assert "jobbers/admin.css" in page
    assert store.sample_counts(120)
    page = client.get(reverse("admin:jobbers_live")).content.decode()
    assert 'data-state="started"' in page
    assert "<polyline" in page


def test_one_date_format_readable_booleans_and_english_labels(client, operator, make_entries,
                                                             django_capture_on_commit_callbacks):
    [task_id] = make_entries(1)
    pk = DeadLetterEntry.objects.get(task_id=task_id).pk
    client.force_login(operator)
    pages = {
        "list": client.get(reverse("admin:jobbers_deadletterentry_changelist")),
        "detail": client.get(reverse("admin:jobbers_deadletterentry_change", args=[pk])),
        "groups": client.get(reverse(GROUPS)),
        "live": client.get(reverse("admin:jobbers_live")),
        "confirm": client.get(reverse("admin:jobbers_deadletterentry_resubmit", args=[pk])),
    }
    for name, response in pages.items():
        assert response.status_code == 200, name
        assert not OTHER_FORMAT.search(response.content.decode()), name
    detail = pages["detail"].content.decode()
    assert ONE_FORMAT.search(detail)  # the record's own fields too, not DATETIME_FORMAT
    assert "icon-no.svg" not in detail  # "publish pending" is no error
    assert re.search(r"Publish pending:</label>\s*<div class=\"readonly\">no</div>", detail)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("admin:jobbers_deadletterentry_resubmit", args=[pk]),
                    {"post": "yes", "task_ids": f'["{task_id}"]'})
    audit = client.get(reverse("admin:jobbers_deadletteraudit_changelist")).content.decode()
    assert "1 audit entry" in audit
    row = client.get(reverse("admin:jobbers_deadletteraudit_change",
                             args=[DeadLetterAudit.objects.get().pk])).content.decode()
    assert "resubmit by operator via admin at " in row
    assert ONE_FORMAT.search(row)
    assert not OTHER_FORMAT.search(row)
    assert "icon-yes.svg" not in audit
    assert ">reset</td>" in audit


def test_the_buttons_need_the_view_permission_too(client, django_user_model, make_entries,
                                                  settings):
    settings.JOBBERS_RESUBMIT_PERMISSION = "staff"  # any staff may resubmit ...
    ids = make_entries(1)
    blind = django_user_model.objects.create_user("blind", password="pw", is_staff=True)
    client.force_login(blind)  # ... but this one may not see the dead letters
    pk = DeadLetterEntry.objects.get(task_id=ids[0]).pk
    for url in (reverse("admin:jobbers_failuregroup_resubmit", args=[group_of(ids[0]).pk]),
                reverse("admin:jobbers_deadletterentry_discard", args=[pk])):
        assert client.get(url).status_code == 403
        assert client.post(url, {"post": "yes", "task_ids": f'["{ids[0]}"]'}
                           ).status_code == 403
    assert DeadLetterEntry.objects.get(pk=pk).status == Status.DEAD
