"""``manage.py jobbers_dlq`` selects one failure group (``--group FINGERPRINT``, as the REST
API's ``fingerprint`` filter), exit 2 for a malformed or unknown one; its tables follow the
terminal's width; and ``celery jobbers dlq`` on this Django-sink app names
``manage.py jobbers_dlq`` when it refuses (exit 2)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from django.core.management import CommandError, call_command

from jobbers_celery.cli import jobbers as celery_jobbers
from jobbers_celery.core import columns
from jobbers_django.models import DeadLetterEntry, FailureGroup, ResubmitRun, Status

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("djapp")]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("jobbers_dlq", *args, stdout=out)
    return out.getvalue()


def fails(code: int, *args: str) -> str:
    with pytest.raises(CommandError) as info:
        run(*args)
    assert info.value.returncode == code, str(info.value)
    return str(info.value)


def _two_groups(make_entries: Any) -> tuple[str, list[str], list[str]]:
    """Three failures of one bug (quoting two warehouses: one group) and two of another."""
    stock = make_entries(2, exception_type="shop.StockError",
                         exception_message="no stock in warehouse 'berlin'")
    stock += make_entries(1, exception_type="shop.StockError",
                          exception_message="no stock in warehouse 'hamburg'")
    price = make_entries(2, exception_type="shop.PriceError",
                         exception_message="negative price for row 7")
    group = DeadLetterEntry.objects.get(task_id=stock[0]).fingerprint
    return group, stock, price


def test_one_failure_group_is_listed_resubmitted_and_paced(make_entries: Any) -> None:
    group, stock, price = _two_groups(make_entries)
    assert FailureGroup.objects.count() == 2
    listed = json.loads(run("list", "--group", group, "--json"))
    assert sorted(r["task_id"] for r in listed["results"]) == sorted(stock)
    dry = run("resubmit", "--group", group, "--dry-run")
    assert dry.startswith("Dry run: would resubmit 3 dead-letter entries; nothing changed.")
    run("resubmit", "--group", group, "--rate", "5", "--halt-after", "1", "--of-last", "3")
    started = ResubmitRun.objects.get()
    assert started.filters == {"fingerprint": group}
    assert started.total == 3
    assert run("discard", "--group", group, "--task", "djproj.flaky_import", "--yes") \
        .startswith("Discarded 3 dead-letter entries")
    assert set(DeadLetterEntry.objects.filter(task_id__in=price)
               .values_list("status", flat=True)) == {Status.DEAD}


def test_a_bad_or_unknown_group_exits_2(make_entries: Any) -> None:
    group, stock, _ = _two_groups(make_entries)
    assert "is not a fingerprint" in fails(2, "list", "--group", "NOT-HEX")
    assert "is not a fingerprint" in fails(2, "resubmit", "--group", "a" * 65)
    assert "no failure group 0123abcd" in fails(2, "resubmit", "--group", "0123abcd")
    assert "no failure group" in fails(2, "list", "--group", "0123abcd")
    assert "give ids or filters, not both" in fails(2, "discard", stock[0], "--group", group,
                                                    "--yes")
    assert set(DeadLetterEntry.objects.values_list("status", flat=True)) == {Status.DEAD}


def test_a_mistyped_task_name_exits_2_with_the_close_matches(make_entries: Any) -> None:
    make_entries(1)
    said = " ".join(fails(2, "list", "--task", "djproj.flaky_imprt").split())
    assert said.startswith("--task: no task named djproj.flaky_imprt: this app does not "
                           "register it and jobbers has no record of it; did you mean "
                           "djproj.flaky_import or ")
    fails(2, "resubmit", "--task", "djproj.flaky_imprt", "--dry-run")
    fails(2, "discard", "--task", "djproj.flaky_imprt", "--yes")
    # a name with dead letters, though no longer registered: an ordinary answer
    make_entries(1, name="legacy.renamed")
    assert json.loads(run("list", "--task", "legacy.renamed", "--json"))["results"]
    assert "No dead-letter entries match." in run("list", "--task", "djproj.big_import")


def test_the_list_follows_the_terminal_width(make_entries: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    make_entries(2, name="shop.import_catalog_from_partner_feed",
                 exception_message="upstream rejected row 4711 of catalog-42: price < 0")
    monkeypatch.setattr(columns, "stdout_is_terminal", lambda: True)  # as in a terminal
    monkeypatch.setenv("COLUMNS", "80")
    narrow = run("list").splitlines()
    print("\n$ COLUMNS=80 manage.py jobbers_dlq list\n" + "\n".join(narrow))
    assert max(len(line) for line in narrow[:3]) <= 80
    assert narrow[0].split()[:3] == ["TASK", "ID", "NAME"]
    assert "..." in narrow[1]
    assert narrow[3].startswith("(hidden at this width: ")
    monkeypatch.setenv("COLUMNS", "200")
    wide = run("list").splitlines()
    assert "shop.import_catalog_from_partner_feed" in wide[1]
    assert not any(line.startswith("(hidden") for line in wide)


def test_celery_dlq_on_the_django_sink_names_the_manage_py_command(djapp: Any) -> None:
    result = CliRunner().invoke(celery_jobbers, ["dlq", "list", "--task", "x"],
                                obj=SimpleNamespace(app=djapp.app))
    assert result.exit_code == 2, result.output
    assert "the Django sink" in result.output
    assert "manage.py jobbers_dlq" in " ".join(result.output.split())
