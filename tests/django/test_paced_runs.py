"""Paced resubmits without a worker: validation (API 400s), the run's state machine (pause,
resume, cancel, with 409s and the audit), the stop rule applied to failures written through
the real sink, the admin pages and buttons, and the exact count when two steps race."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from django.db import connection

from jobbers_django import runs, services
from jobbers_django.dlq import run_step
from jobbers_django.models import (
    Action,
    DeadLetterAudit,
    DeadLetterEntry,
    ItemOutcome,
    ResubmitRun,
    ResubmitRunItem,
    RunStatus,
    Source,
    Status,
)
from jobbers_django.services import Selection
from tests.django.api_helpers import API, assert_bad, login, post

pytestmark = pytest.mark.django_db

STEP = runs.STEP_TASK


def flaky(n: int, make_entries: Any, key: str = "djproj:paced:unfixed") -> list[str]:
    """``n`` dead letters of ``djproj.flaky_import`` (one failure group)."""
    return make_entries(n, args=[key], kwargs={},
                        exception_message=f"upstream rejected row 17 of {key}")


def hurry(run: ResubmitRun) -> None:
    """Make everything due: the run's pace counts from a minute ago."""
    from datetime import timedelta

    from django.utils import timezone

    ResubmitRun.objects.filter(pk=run.pk).update(
        paced_since=timezone.now() - timedelta(minutes=1))


def task_publishes(published: list[str], ids: list[str]) -> list[str]:
    """The publishes of ``ids`` (the step task's own publishes left out)."""
    wanted = set(ids)
    return [i for i in published if i in wanted]


# ---------------------------------------------------------------------- validation
@pytest.mark.parametrize(("body", "field"), [
    ({"rate": 0}, "rate"),
    ({"rate": -1}, "rate"),
    ({"rate": 501}, "rate"),
    ({"rate": 1e-300}, "rate"),  # would never end
    ({"rate": 0.09}, "rate"),
    ({"rate": "fast"}, "rate"),
    ({"rate": True}, "rate"),
    ({"rate": 5, "halt_after": 3}, "of_last"),
    ({"rate": 5, "of_last": 10}, "halt_after"),
    ({"rate": 5, "halt_after": 11, "of_last": 10}, "halt_after"),
    ({"rate": 5, "halt_after": -1, "of_last": 10}, "halt_after"),
    ({"rate": 5, "halt_after": 0, "of_last": 0}, "of_last"),
    ({"rate": 5, "halt_after": 1, "of_last": 1001}, "of_last"),
    ({"halt_after": 1, "of_last": 10}, "rate"),
])
@pytest.mark.parametrize("path", ["dead-letter-queue/resubmit",
                                  "dead-letter-queue/resubmit-runs"])
def test_bad_paces_are_400s_naming_the_field(operator, make_entries, body, field, path):
    (task_id,) = flaky(1, make_entries)
    response = post(login(operator), path, {"task_ids": [task_id], **body})
    assert_bad(response, field)
    assert not ResubmitRun.objects.exists()


def test_the_runs_endpoint_needs_a_rate_and_a_selection(operator, make_entries):
    client = login(operator)
    (task_id,) = flaky(1, make_entries)
    assert_bad(post(client, "dead-letter-queue/resubmit-runs", {"task_ids": [task_id]}), "rate")
    assert_bad(post(client, "dead-letter-queue/resubmit-runs", {"rate": 5}), "task_ids")
    assert_bad(post(client, "dead-letter-queue/resubmit-runs",
                    {"rate": 5, "task_ids": [task_id], "dry_run": True}), "dry_run")
    assert not ResubmitRun.objects.exists()


def test_a_reader_may_watch_runs_but_not_start_or_control_them(staff, operator, make_entries):
    ids = flaky(2, make_entries)
    started = post(login(operator), "dead-letter-queue/resubmit-runs",
                   {"task_ids": ids, "rate": 5})
    assert started.status_code == 202, started.content
    run_id = started.json()["id"]
    reader = login(staff)
    assert post(reader, "dead-letter-queue/resubmit-runs",
                {"task_ids": ids, "rate": 5}).status_code == 403
    assert post(reader, f"dead-letter-queue/resubmit-runs/{run_id}/pause", {}).status_code == 403
    assert reader.get(f"{API}/dead-letter-queue/resubmit-runs/{run_id}").status_code == 200
    assert reader.get(f"{API}/dead-letter-queue/resubmit-runs").json()["results"][0]["id"] \
        == run_id


# ---------------------------------------------------------------------- state machine
def test_start_pause_resume_cancel_through_the_api(operator, make_entries):
    ids = flaky(3, make_entries)
    client = login(operator)
    answer = post(client, "dead-letter-queue/resubmit",
                  {"task_ids": ids, "rate": 2.5, "halt_after": 1, "of_last": 4,
                   "version": "entry"})
    assert answer.status_code == 202, answer.content
    run = answer.json()
    assert answer["Location"].endswith(f"/jobbers/dead-letter-queue/resubmit-runs/{run['id']}")
    assert (run["status"], run["total"], run["remaining"], run["published"]) == (
        "queued", 3, 3, 0)
    assert run["rule"] == "halt when more than 1 of the last 4 failed again"
    # nothing is published by the request: the entries stay dead until a step takes them
    assert set(DeadLetterEntry.objects.values_list("status", flat=True)) == {Status.DEAD}

    base = f"dead-letter-queue/resubmit-runs/{run['id']}"
    assert post(client, f"{base}/resume", {}).status_code == 409  # not paused
    assert post(client, f"{base}/pause", {}).json()["status"] == "paused"
    assert post(client, f"{base}/pause", {}).status_code == 409
    assert post(client, f"{base}/resume", {}).json()["status"] == "running"
    assert post(client, f"{base}/cancel", {}).json()["status"] == "cancelled"
    for control in ("pause", "resume", "cancel"):
        assert post(client, f"{base}/{control}", {}).status_code == 409
    assert post(client, f"{base}/stop", {}).status_code == 404
    assert post(client, "dead-letter-queue/resubmit-runs/999999/pause", {}).status_code == 404
    assert client.get(f"{API}/dead-letter-queue/resubmit-runs/999999").status_code == 404

    actions = list(DeadLetterAudit.objects.filter(run_id=run["id"]).order_by("at", "id")
                   .values_list("action", "username", "source"))
    assert actions == [(a, "operator", "api") for a in (
        Action.RUN_START, Action.RUN_PAUSE, Action.RUN_RESUME, Action.RUN_CANCEL)]
    # a step of the cancelled run publishes nothing and ends its chain
    stale = ResubmitRun.objects.get(pk=run["id"])
    assert runs.step(stale.pk, stale.chain) is None
    assert set(DeadLetterEntry.objects.values_list("status", flat=True)) == {Status.DEAD}


def test_a_step_of_an_old_chain_does_nothing(make_entries):
    ids = flaky(2, make_entries)
    run = runs.start(Selection(task_ids=tuple(ids)), runs.Pace(10))
    assert runs.step(run.pk, "not-the-chain") is None
    run.refresh_from_db()
    assert (run.status, run.published) == (RunStatus.QUEUED, 0)


def test_the_stop_rule_halts_on_failures_written_by_the_sink(committed, make_entries, jobbers,
                                                              published):
    """10 entries at 500/s, rule "more than 2 of the last 4": the first step publishes one,
    the next the rest; three of them fail again (new failures through the real sink) and
    the next step halts the run, publishing nothing more."""
    from jobbers_django.sink import write_entry
    from tests.django.conftest import dead_letter

    ids = flaky(10, make_entries)
    run = runs.start(Selection(filters={"task_name": "djproj.flaky_import"}, limit=8),
                     runs.Pace(500, halt_after=2, of_last=4))
    assert run.total == 8
    committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert (run.status, run.published, run.remaining) == (RunStatus.RUNNING, 1, 7)
    first = ResubmitRunItem.objects.get(run=run, position=0).task_id
    hurry(run)
    committed(runs.step, run.pk, run.chain)  # everything is due: all taken
    run.refresh_from_db()
    assert run.published == 8
    assert sorted(task_publishes(published, ids)) == sorted(
        ResubmitRunItem.objects.filter(run=run).values_list("task_id", flat=True))
    failed = [first, *ResubmitRunItem.objects.filter(run=run, position__in=[1, 2])
              .values_list("task_id", flat=True)]
    for task_id in failed:
        write_entry(dead_letter(task_id, attempt=2, args=["k"], kwargs={}))
    assert committed(runs.step, run.pk, run.chain) is not None  # others still in flight
    run.refresh_from_db()
    assert run.status == RunStatus.HALTED
    assert run.failed_again == 3
    assert run.halt_reason == ("3 of the last 3 resubmitted tasks failed again (the rule: "
                               "halt when more than 2 of the last 4)")
    halt = DeadLetterAudit.objects.get(run=run, action=Action.RUN_HALT)
    assert halt.detail == run.halt_reason
    assert sorted(halt.acted_ids) == sorted(
        ResubmitRunItem.objects.filter(run=run).values_list("task_id", flat=True))
    # the two entries the run did not select are untouched
    assert DeadLetterEntry.objects.filter(status=Status.DEAD, resubmit_count=0).count() == 2


def test_items_whose_entry_was_resubmitted_meanwhile_are_skipped(committed, make_entries):
    ids = flaky(3, make_entries)
    run = runs.start(Selection(task_ids=tuple(ids)), runs.Pace(500))
    committed(services.resubmit, Selection(task_ids=(ids[1],)))
    committed(runs.step, run.pk, run.chain)
    hurry(run)
    committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert (run.published, run.skipped, run.remaining) == (2, 1, 0)
    assert DeadLetterEntry.objects.get(task_id=ids[1]).resubmit_count == 1


# ---------------------------------------------------------------------- exact counts
@pytest.mark.django_db(transaction=True)
def test_two_steps_racing_publish_each_entry_once(make_entries, jobbers, published):
    """Two step chains of the same run (a duplicate the guard did not stop), each on its own
    database connection, step at the same moment again and again; and two bare claims race
    too. Every entry is published exactly once."""
    ids = flaky(60, make_entries)
    run = runs.start(Selection(task_ids=tuple(ids)), runs.Pace(20))
    runs.step(run.pk, run.chain)  # queued -> running
    hurry(run)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def chain() -> None:
        try:
            for _ in range(6):
                barrier.wait(timeout=30)
                runs.step(run.pk, run.chain)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=chain) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    run.refresh_from_db()
    assert (run.published, run.remaining) == (60, 0)
    mine = task_publishes(published, ids)
    assert len(mine) == 60
    assert sorted(mine) == sorted(ids)
    assert set(DeadLetterEntry.objects.values_list("resubmit_count", flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
def test_two_claims_racing_take_disjoint_items(make_entries):
    """The claim alone (no run lock): two transactions claiming all 40 items at once take
    each item once between them."""
    from django.db import transaction
    from django.utils import timezone

    ids = flaky(40, make_entries)
    run = runs.start(Selection(task_ids=tuple(ids)), runs.Pace(500))
    barrier = threading.Barrier(2)
    taken: list[list[int]] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            barrier.wait(timeout=30)
            with transaction.atomic():
                taken.append(run_step._claim(run, 40, timezone.now()))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    both = taken[0] + taken[1]
    assert len(both) == len(set(both)) == 40
    assert ResubmitRunItem.objects.filter(run=run, published_at__isnull=False).count() == 40
    assert set(DeadLetterEntry.objects.values_list("resubmit_count", flat=True)) == {1}


# ---------------------------------------------------------------------- admin
def test_the_admin_starts_a_paced_run_from_the_confirmation(operator, client, make_entries,
                                                            djapp):
    ids = flaky(3, make_entries)
    client.force_login(operator)
    confirm = client.post("/admin/jobbers/deadletterentry/", {
        "action": "resubmit_selected", "_selected_action": [
            str(pk) for pk in DeadLetterEntry.objects.values_list("pk", flat=True)]})
    assert b"Start a paced resubmit" in confirm.content
    response = client.post("/admin/jobbers/deadletterentry/", {
        "action": "resubmit_selected", "post": "yes", "paced": "1", "rate": "4",
        "halt_after": "2", "of_last": "5", "task_ids": f'["{ids[0]}", "{ids[1]}"]',
        "_selected_action": [str(pk) for pk in
                             DeadLetterEntry.objects.values_list("pk", flat=True)]})
    run = ResubmitRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/admin/jobbers/resubmitrun/{run.pk}/change/"
    assert (run.total, run.rate, run.halt_after, run.of_last, run.source, run.username) == (
        2, 4.0, 2, 5, Source.ADMIN, "operator")
    bad = client.post("/admin/jobbers/deadletterentry/", {
        "action": "resubmit_selected", "post": "yes", "paced": "1", "rate": "0",
        "task_ids": f'["{ids[2]}"]', "_selected_action": [str(pk) for pk in
                                                         DeadLetterEntry.objects.values_list(
                                                             "pk", flat=True)]}, follow=True)
    assert b"No paced resubmit was started: rate: must be a number" in bad.content
    slow = client.post("/admin/jobbers/deadletterentry/", {
        "action": "resubmit_selected", "post": "yes", "paced": "1", "rate": "1e-300",
        "task_ids": f'["{ids[2]}"]', "_selected_action": [str(pk) for pk in
                                                         DeadLetterEntry.objects.values_list(
                                                             "pk", flat=True)]}, follow=True)
    assert b"No paced resubmit was started: rate: must be a number of tasks per second, " \
        b"at least 0.1" in slow.content
    assert ResubmitRun.objects.count() == 1


def test_the_run_page_refreshes_and_its_buttons_need_the_permission(operator, staff, client,
                                                                   make_entries):
    ids = flaky(2, make_entries)
    run = runs.start(Selection(task_ids=tuple(ids)), runs.Pace(3, 1, 2), user=operator)
    page = f"/admin/jobbers/resubmitrun/{run.pk}/change/"
    client.force_login(staff)
    shown = client.get(page)
    assert shown.status_code == 200
    # refreshed in place by jobbers/live.js (a meta refresh is an axe-core violation)
    assert b'data-refresh-seconds="2"' in shown.content
    assert b"jobbers/live.js" in shown.content
    assert b'data-count="remaining">2<' in shown.content
    assert b"jobbers-run-pause" not in shown.content  # a reader sees no buttons
    assert client.post(f"/admin/jobbers/resubmitrun/{run.pk}/control/pause/").status_code == 403

    client.force_login(operator)
    assert b"jobbers-run-pause" in client.get(page).content
    moved = client.post(f"/admin/jobbers/resubmitrun/{run.pk}/control/pause/", follow=True)
    assert b"Paced resubmit #%d paused." % run.pk in moved.content
    assert b"jobbers-run-resume" in moved.content
    assert client.get(f"/admin/jobbers/resubmitrun/{run.pk}/control/pause/").status_code == 405
    client.post(f"/admin/jobbers/resubmitrun/{run.pk}/control/cancel/")
    done = client.get(page)
    assert b"data-refresh-seconds" not in done.content  # nothing moves any more
    assert b"cancelled" in done.content
    assert client.get("/admin/jobbers/resubmitrun/").status_code == 200
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert ItemOutcome.PENDING == ""


def test_a_run_whose_chain_ended_is_revived(make_entries, committed, published):
    """The step task failed for good (or the broker was down at the start): after a minute
    without a step, ``jobbers_publish_pending`` starts a new chain; the old one stops."""
    from datetime import timedelta

    from django.core.management import call_command
    from django.utils import timezone

    ids = flaky(2, make_entries)
    run = runs.start(Selection(task_ids=tuple(ids)), runs.Pace(5))
    assert committed(runs.revive) == []  # just started: not stale
    ResubmitRun.objects.filter(pk=run.pk).update(
        created_at=timezone.now() - timedelta(minutes=2))
    out = io.StringIO()
    committed(call_command, "jobbers_publish_pending", stdout=out)
    assert f"restarted the steps of paced resubmit(s) #{run.pk}" in out.getvalue()
    fresh = ResubmitRun.objects.get(pk=run.pk)
    assert fresh.chain != run.chain
    assert len(published) == 1  # the new chain's first step
    assert runs.step(run.pk, run.chain) is None  # the old chain stops
    assert committed(runs.revive) == []


def test_a_paced_run_as_the_current_version(operator, make_entries, jobbers):
    ids = flaky(2, make_entries)
    client = login(operator)
    answer = post(client, "dead-letter-queue/resubmit-runs",
                  {"task_ids": ids, "rate": 5, "version": "current"})
    assert answer.status_code == 202, answer.content
    assert answer.json()["version"] == "current"
    unknown = make_entries(1, name="djproj.not_registered_here")
    assert_bad(post(client, "dead-letter-queue/resubmit-runs",
                    {"task_ids": unknown, "rate": 5, "version": "current"}), "version")
    assert ResubmitRun.objects.count() == 1


def test_a_cancelled_resubmitted_task_counts_as_failed_again(committed, make_entries, jobbers,
                                                             published):
    """The one settle rule (``docs/howto/dead-letters.md``: "failed, dropped, stalled or
    cancelled -> failed again"), as the Redis sink's runs apply it: two of three resubmitted
    tasks cancelled before they ran count as failed again, and "more than 1 of the last 3"
    halts the run."""
    ids = flaky(3, make_entries)
    run = runs.start(Selection(task_ids=tuple(ids)), runs.Pace(500, halt_after=1, of_last=3))
    committed(runs.step, run.pk, run.chain)
    hurry(run)
    committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert run.published == 3
    assert sorted(task_publishes(published, ids)) == sorted(ids)
    cancelled = ids[:2]
    for task_id in cancelled:
        assert jobbers.cancel(task_id)
    committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert sorted(ResubmitRunItem.objects.filter(run=run, outcome=ItemOutcome.FAILED_AGAIN)
                  .values_list("task_id", flat=True)) == sorted(cancelled)
    assert (run.failed_again, run.status) == (2, RunStatus.HALTED)
    assert run.halt_reason == ("2 of the last 2 resubmitted tasks failed again (the rule: "
                               "halt when more than 1 of the last 3)")


def test_a_step_settles_its_items_with_one_batched_read(committed, make_entries, jobbers,
                                                       published, monkeypatch):
    """The settle reads the records of the items it settles in one batch
    (``Jobbers.states_of``), not one ``get`` per item while it holds the run's row lock."""
    from jobbers_celery import Jobbers

    ids = flaky(5, make_entries)
    run = runs.start(Selection(task_ids=tuple(ids)), runs.Pace(500))
    committed(runs.step, run.pk, run.chain)
    hurry(run)
    committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert run.published == 5
    for task_id in ids[:2]:
        assert jobbers.cancel(task_id)
    calls: list[str] = []
    real_get, real_states = Jobbers.get, Jobbers.states_of

    def get(self: Jobbers, task_id: str) -> Any:
        calls.append("get")
        return real_get(self, task_id)

    def states_of(self: Jobbers, task_ids: Any) -> Any:
        ids_read = list(task_ids)
        calls.append(f"states_of {len(ids_read)}")
        return real_states(self, ids_read)

    monkeypatch.setattr(Jobbers, "get", get)
    monkeypatch.setattr(Jobbers, "states_of", states_of)
    committed(runs.step, run.pk, run.chain)
    assert calls == ["states_of 5"]
    assert sorted(ResubmitRunItem.objects.filter(run=run, outcome=ItemOutcome.FAILED_AGAIN)
                  .values_list("task_id", flat=True)) == sorted(ids[:2])


def test_the_models_statuses_and_outcomes_are_the_one_definition():
    """The model's choices stay as the migrations hold them; they agree with jobbers_celery's
    one definition of a run's status, its final statuses and the settled outcomes."""
    from jobbers_celery import RunOutcome
    from jobbers_celery import RunStatus as OneStatus
    from jobbers_celery.resubmit.pace import FINAL
    from jobbers_django.models import FINAL_STATUSES

    assert [s.value for s in RunStatus] == [s.value for s in OneStatus]
    assert {s.value for s in FINAL_STATUSES} == {s.value for s in FINAL}
    assert set(run_step.ITEM_OUTCOMES) == {RunOutcome.COMPLETED, RunOutcome.FAILED_AGAIN,
                                           RunOutcome.ENDED_OTHERWISE}
    assert set(run_step.ITEM_OUTCOMES.values()) == {
        ItemOutcome.COMPLETED, ItemOutcome.FAILED_AGAIN, ItemOutcome.OTHER}
