"""``manage.py jobbers_dlq``: list, show, resubmit (plain, dry run, paced), discard and run,
redacted output, ``--json``, and the exit codes (2 bad input, 3 not found), through
``call_command`` and through a real ``python -m django`` subprocess."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from django.core.management import CommandError, call_command
from django.db import connection

from jobbers_celery.cli import jobbers as celery_jobbers
from jobbers_django.models import DeadLetterAudit, DeadLetterEntry, ResubmitRun, Status
from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("jobbers_dlq", *args, stdout=out)
    return out.getvalue()


def fails(code: int, *args: str) -> str:
    with pytest.raises(CommandError) as info:
        run(*args)
    assert info.value.returncode == code, str(info.value)
    return str(info.value)


def test_list_and_show_are_redacted(make_entries):
    ids = make_entries(2, exception_message="login with password hunter2 refused")
    table = run("list", "--task", "djproj.flaky_import")
    assert table.splitlines()[0].split() == ["TASK", "ID", "NAME", "VER", "QUEUE", "STATUS",
                                             "FAILURES", "LAST", "FAILED", "EXCEPTION"]
    assert all(i in table for i in ids)
    assert "hunter2" not in table
    assert table.rstrip().endswith("2 entries")
    data = json.loads(run("list", "--json", "--limit", "1"))
    assert data["more"] is True
    assert data["results"][0]["kwargs"]["password"] == "********"

    shown = run("show", ids[0])
    assert f"task id      {ids[0]}" in shown
    assert "hunter2" not in shown
    assert '"password": "********"' in shown
    detail = json.loads(run("show", ids[0], "--json"))
    assert detail["entry"]["task_id"] == ids[0]
    assert [f["attempt"] for f in detail["failures"]] == [1]
    assert "hunter2" not in json.dumps(detail)
    assert "No dead-letter entries match." in run("list", "--queue", "nowhere")


def test_bad_input_and_not_found(make_entries):
    (task_id,) = make_entries(1)
    assert "no criteria never means everything" in fails(2, "resubmit")
    assert "no criteria never means everything" in fails(2, "discard", "--yes")
    fails(2, "resubmit", task_id, "--limit", "5")
    assert "at most 4096 characters" in fails(2, "resubmit", "x" * 4097)
    assert "names no task" in fails(2, "show", "bad\udcff")  # a shell's byte 0xff
    assert "not in the dead-letter queue" in fails(3, "show", "bad id!")  # an id, unknown
    fails(2, "list", "--limit", "0")
    assert "--rate" in fails(2, "resubmit", task_id, "--rate", "0")
    assert "--rate: must be a number of tasks per second, at least 0.1" in fails(
        2, "resubmit", task_id, "--rate", "1e-300")
    fails(2, "resubmit", task_id, "--halt-after", "2", "--of-last", "5")
    assert "--halt-after: must be between 0" in fails(2, "resubmit", task_id, "--rate", "5", "--halt-after", "6",
                                 "--of-last", "5")
    fails(2, "discard", task_id)  # no --yes and no terminal to ask
    assert "not in the dead-letter queue" in fails(3, "show", "no-such-task")
    fails(3, "run", "424242")
    assert DeadLetterEntry.objects.get().status == Status.DEAD
    assert not DeadLetterAudit.objects.exists()


@pytest.mark.parametrize(("args", "model"), [
    (["resubmit", "x" * 4097], "task id of 4097 characters: at most 4096 characters"),
    (["discard", "--yes", "a\udcff"], "task id a\\udcff is not UTF-8: it names no task"),
    (["resubmit", "--task", "t", "--halt-after", "1"], "--halt-after and --of-last need --rate"),
])
def test_both_command_lines_refuse_alike(args: list[str], model: str) -> None:
    """The same bad input, the same words and exit code from ``celery jobbers dlq`` (the
    dead-letter command-line model, ``jobbers_celery.deadletter.selection``)."""
    assert fails(2, *args) == model
    celery = CliRunner().invoke(celery_jobbers, ["dlq", *args], obj=None)
    assert celery.exit_code == 2, celery.output
    assert model in celery.output


@pytest.mark.django_db(transaction=True)
def test_resubmit_dry_run_then_for_real_then_discard(make_entries, jobbers, published):
    ids = make_entries(3)
    dry = run("resubmit", "--task", "djproj.flaky_import", "--dry-run")
    assert dry.startswith("Dry run: would resubmit 3 dead-letter entries; nothing changed.")
    assert not published
    assert set(DeadLetterEntry.objects.values_list("status", flat=True)) == {Status.DEAD}

    out = run("resubmit", ids[0], ids[1])
    assert out.startswith("Resubmitted 2 dead-letter entries: 2 published (audit #")
    assert sorted(published) == sorted(ids[:2])
    again = json.loads(run("resubmit", ids[0], "--json"))
    assert again["resubmitted"] == []
    assert again["skipped"] == [{"task_id": ids[0], "why": "status is resubmitted"}]

    assert run("discard", "--task", "djproj.flaky_import", "--yes").startswith(
        "Discarded 1 dead-letter entry")
    assert DeadLetterEntry.objects.get(task_id=ids[2]).status == Status.DISCARDED
    audit = DeadLetterAudit.objects.order_by("at", "id").values_list("source", "action")
    assert list(audit) == [("code", "resubmit"), ("code", "resubmit"), ("code", "discard")]


def test_a_paced_resubmit_and_its_controls(make_entries):
    make_entries(4)
    started = run("resubmit", "--task", "djproj.flaky_import", "--rate", "2",
                  "--halt-after", "1", "--of-last", "3")
    run_id = ResubmitRun.objects.get().pk
    assert started.splitlines() == [
        (f"Started paced resubmit #{run_id}: 4 entries at 2 per second; halt when more than 1 "
        "of the last 3 failed again."),
        (f"Follow it: manage.py jobbers_dlq run {run_id} (or the admin's Paced resubmits "
        "page); it runs on the Celery workers.")]
    progress = run("run", str(run_id))
    assert progress.splitlines()[0] == (f"Paced resubmit #{run_id}: queued, 2/s, halt when "
                                        "more than 1 of the last 3 failed again")
    assert progress.splitlines()[2].split() == ["4", "0", "0", "0", "0", "4"]
    assert json.loads(run("run", str(run_id), "--pause", "--json"))["status"] == "paused"
    assert "can be resumed only when paused" not in run("run", str(run_id), "--resume")
    assert "resumed only when paused" in fails(2, "run", str(run_id), "--resume")
    assert run("run", str(run_id), "--cancel").startswith(
        f"Paced resubmit #{run_id}: cancelled")


@pytest.mark.django_db(transaction=True)
def test_a_real_subprocess(make_entries):
    """``python -m django jobbers_dlq`` as an operator runs it: exit codes and output."""
    ids = make_entries(2, exception_message="token=abc123secret rejected")
    env = subprocess_env({"DJANGO_SETTINGS_MODULE": "tests.django.settings",
                          "JOBBERS_TEST_DB_NAME": connection.settings_dict["NAME"]})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "django", "jobbers_dlq", *args],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                              check=False)

    listed = cli("list")
    assert listed.returncode == 0, listed.stderr
    print("\n$ manage.py jobbers_dlq list\n" + listed.stdout)
    assert all(i in listed.stdout for i in ids)
    assert "abc123secret" not in listed.stdout

    dry = cli("resubmit", "--task", "djproj.flaky_import", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    print("$ manage.py jobbers_dlq resubmit --task djproj.flaky_import --dry-run\n"
          + dry.stdout)
    assert dry.stdout.startswith("Dry run: would resubmit 2 dead-letter entries")

    none = cli("resubmit")
    assert none.returncode == 2
    assert "give task ids or at least one filter" in none.stderr
    print("$ manage.py jobbers_dlq resubmit   (exit 2)\n" + none.stderr)
    assert cli("resubmit", "--version", "two").returncode == 2  # argparse's own usage error
    assert cli("show", "no-such-task").returncode == 3
    assert set(DeadLetterEntry.objects.values_list("status", flat=True)) == {Status.DEAD}
