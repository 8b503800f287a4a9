"""A halted paced resubmit can be continued (its cause fixed), and a run links to the
failure group it was started for (and the group's row to its runs): the Django sink's
engine through the REST API, the admin and ``manage.py jobbers_dlq``. The stop rule of a
continued run counts only what settles after the continue; continuing a run that is not
halted is a 409 (API), a warning (admin) or exit 2 (command)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from jobbers_django import runs
from jobbers_django.models import (
    Action,
    DeadLetterAudit,
    DeadLetterEntry,
    ResubmitRun,
    ResubmitRunItem,
    RunStatus,
)
from jobbers_django.services import Selection
from tests.django.api_helpers import login, post
from tests.django.test_paced_runs import flaky, hurry

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("djapp")]


def _fail_again(run: ResubmitRun, positions: list[int]) -> None:
    """The items at ``positions`` fail again (new failures through the real sink)."""
    from jobbers_django.sink import write_entry
    from tests.django.conftest import dead_letter

    for task_id in ResubmitRunItem.objects.filter(run=run, position__in=positions) \
            .values_list("task_id", flat=True):
        write_entry(dead_letter(task_id, attempt=2, args=["djproj:paced:unfixed"], kwargs={},
                                exception_message="upstream rejected row 17 of "
                                                  "djproj:paced:unfixed"))


def _halted(committed: Any, make_entries: Any) -> tuple[ResubmitRun, str]:
    """A run of one failure group (8 entries, "more than 1 of the last 4"), halted by two
    failures again; its group's fingerprint."""
    ids = flaky(8, make_entries)
    group = DeadLetterEntry.objects.get(task_id=ids[0]).fingerprint
    run = runs.start(Selection(filters={"fingerprint": group}, limit=8),
                     runs.Pace(500, halt_after=1, of_last=4))
    committed(runs.step, run.pk, run.chain)
    hurry(run)
    committed(runs.step, run.pk, run.chain)  # all eight published
    _fail_again(run, [0, 1])
    committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert run.status == RunStatus.HALTED
    return run, group


def test_a_halted_run_continues_and_its_rule_starts_over(committed, make_entries, operator):
    run, _ = _halted(committed, make_entries)
    reason = run.halt_reason
    client = login(operator)
    base = f"dead-letter-queue/resubmit-runs/{run.pk}"
    assert post(client, f"{base}/resume", {}).status_code == 409  # resume is for paused
    answer = post(client, f"{base}/continue", {})
    assert answer.status_code == 200, answer.content
    assert (answer.json()["status"], answer.json()["halt_reason"]) == ("running", "")
    assert post(client, f"{base}/continue", {}).status_code == 409  # not halted now
    audit = DeadLetterAudit.objects.filter(run=run).order_by("at", "id").last()
    assert audit is not None
    assert (audit.action, audit.username, audit.source) == (Action.RUN_RESUME, "operator",
                                                            "api")
    assert audit.detail == f"continued after a halt: {reason}"

    run.refresh_from_db()
    assert runs.step(run.pk, run.chain) is not None  # its new chain goes on
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # the two old failures are not counted again
    _fail_again(run, [2])
    committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # 1 of the last 1 since: not more than 1
    _fail_again(run, [3])
    committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert run.status == RunStatus.HALTED
    assert run.halt_reason.startswith("2 of the last 2 resubmitted tasks failed again")
    assert run.failed_again == 4


def test_run_and_group_link_to_each_other(committed, make_entries, operator, client):
    run, group = _halted(committed, make_entries)
    client.force_login(operator)
    page = client.get(f"/admin/jobbers/resubmitrun/{run.pk}/change/")
    assert page.status_code == 200
    assert b'id="jobbers-run-continue"' in page.content
    assert f'href="/admin/jobbers/failuregroup/?fingerprint={group}" ' \
           'id="jobbers-run-group"'.encode() in page.content
    groups = client.get("/admin/jobbers/failuregroup/")
    assert f'href="/admin/jobbers/resubmitrun/?fingerprint={group}">1 paced resubmit<' \
        .encode() in groups.content
    listed = client.get(f"/admin/jobbers/resubmitrun/?fingerprint={group}")
    assert listed.status_code == 200
    assert f'href="/admin/jobbers/resubmitrun/{run.pk}/change/"'.encode() in listed.content
    other = client.get("/admin/jobbers/resubmitrun/?fingerprint=0123abcd")
    assert f"/admin/jobbers/resubmitrun/{run.pk}/change/".encode() not in other.content

    moved = client.post(f"/admin/jobbers/resubmitrun/{run.pk}/control/continue/", follow=True)
    assert b"Paced resubmit #%d continued." % run.pk in moved.content
    assert b'id="jobbers-run-continue"' not in moved.content
    again = client.post(f"/admin/jobbers/resubmitrun/{run.pk}/control/continue/", follow=True)
    assert b"Not continued: run %d is running" % run.pk in again.content


def test_the_command_continues_a_halted_run(committed, make_entries):
    run, _ = _halted(committed, make_entries)
    out = io.StringIO()
    call_command("jobbers_dlq", "run", str(run.pk), "--continue", stdout=out)
    assert out.getvalue().startswith(f"Paced resubmit #{run.pk}: running")
    with pytest.raises(CommandError) as info:
        call_command("jobbers_dlq", "run", str(run.pk), "--continue", stdout=io.StringIO())
    assert info.value.returncode == 2
    assert "can be continued only when halted" in str(info.value)
