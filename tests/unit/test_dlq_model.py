"""The dead-letter command lines' one model (``jobbers_celery.deadletter.selection``): ids,
filters, the no-criteria rule, the paced options, exit codes and a run's columns. The Django
command's use of it: tests/django/test_dlq_command.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import click
import pytest
from click.testing import CliRunner

from jobbers_celery import (
    DeadLetter,
    DlqExit,
    DlqFilters,
    DlqRunView,
    DlqUsageError,
    RunStatus,
    check_pace_options,
    check_task_id,
    dlq_criteria,
)
from jobbers_celery.cli import base, jobbers
from jobbers_celery.deadletter.selection import TASK_ID_MAX, DlqId, DlqIdError


def _entry(queue: str = "q", name: str = "t", version: int | None = 2) -> DeadLetter:
    return DeadLetter(task_id="id", name=name, version=version, queue=queue, reason="failed",
                      args=[], kwargs={}, exception_type=None, exception_message=None,
                      traceback=None, attempt=1, retry_attempt=0, worker=None,
                      failed_at=datetime(2026, 1, 1, tzinfo=UTC))


def test_the_celery_command_exits_with_the_models_codes() -> None:
    assert (base.EXIT_FAILURE, base.EXIT_NOT_FOUND) == (DlqExit.RUNTIME, DlqExit.NOT_FOUND)
    assert click.UsageError("x").exit_code == DlqExit.USAGE
    assert [int(code) for code in DlqExit] == [0, 1, 2, 3]


def test_ids_any_string_up_to_the_bound_and_text() -> None:
    for odd in ("", "a b", "a\nb", "x" * TASK_ID_MAX, "é"):
        assert check_task_id(odd) == odd
    with pytest.raises(DlqIdError, match="task id of 4097 characters: at most 4096 characters"):
        check_task_id("x" * 4097)
    with pytest.raises(DlqIdError, match=r"task id a\\udcff is not UTF-8: it names no task"):
        check_task_id("a\udcff")


def test_an_entry_id_names_an_attempt_a_task_id_does_not() -> None:
    assert DlqId.parse("abc:3") == DlqId("abc", 3)
    assert DlqId.parse("a:b") == DlqId("a:b")
    assert DlqId.parse("abc:3", per_attempt=False) == DlqId("abc:3")
    assert str(DlqId("abc", 3)) == "abc:3"


def test_filters_match_every_value_given() -> None:
    assert not DlqFilters()
    assert DlqFilters().matches(_entry())
    assert DlqFilters(version=0)  # a version 0 is a filter
    assert DlqFilters("q", "t", 2).matches(_entry())
    assert not DlqFilters(queue="other").matches(_entry())
    assert not DlqFilters(task="other").matches(_entry())
    assert not DlqFilters(version=3).matches(_entry())
    assert DlqFilters(queue="q", version=2).given() == {"queue": "q", "version": 2}


def test_no_criteria_never_means_everything() -> None:
    for per_attempt, noun in ((True, "entry"), (False, "task")):
        with pytest.raises(DlqUsageError) as info:
            dlq_criteria([], DlqFilters(), per_attempt=per_attempt)
        assert info.value.message == (
            f"give {noun} ids or at least one filter (--queue, --task, --version); "
            "no criteria never means everything")
    assert dlq_criteria([], DlqFilters(task="t"), per_attempt=True) == []
    assert dlq_criteria(["a:1", "b"], DlqFilters(), per_attempt=True) == [
        DlqId("a", 1), DlqId("b")]
    with pytest.raises(DlqIdError):
        dlq_criteria(["ok", "x" * 4097], DlqFilters(task="t"), per_attempt=False)


def test_the_stop_rule_needs_a_rate() -> None:
    check_pace_options(None, None, None)
    check_pace_options(2.0, 1, 3)
    for halt_after, of_last in ((1, None), (None, 3), (1, 3)):
        with pytest.raises(DlqUsageError, match="--halt-after and --of-last need --rate"):
            check_pace_options(None, halt_after, of_last)
    error = DlqUsageError.of_field("halt_after", "must be between 0 and of_last (10)")
    assert (error.option, error.message) == (
        "--halt-after", "--halt-after: must be between 0 and of_last (10)")


@dataclass
class _Run:
    id: int = 7
    status: str = RunStatus.PAUSED
    rate: float = 2.0
    rule: str = "no stop rule"
    total: int = 20
    published: int = 2
    completed: int = 1
    failed_again: int = 1
    skipped: int = 0
    remaining: int = 18


def test_a_run_is_shown_in_one_set_of_columns() -> None:
    view = DlqRunView(_Run())
    assert view.headline == "Paced resubmit #7: paused, 2/s, no stop rule"
    assert view.started == "Started paced resubmit #7: 20 entries at 2 per second; no stop rule."
    assert dict(zip(view.COLUMNS, view.row, strict=True)) == {
        "SELECTED": 20, "PUBLISHED": 2, "COMPLETED": 1, "FAILED AGAIN": 1, "SKIPPED": 0,
        "REMAINING": 18}


@pytest.mark.parametrize(("args", "message"), [
    (["dlq", "resubmit"], ("Error: give entry ids or at least one filter (--queue, --task, "
                           "--version); no criteria never means everything")),
    (["dlq", "discard", "x" * 4097],
     "Error: Invalid value for 'ID': task id of 4097 characters: at most 4096 characters"),
    (["show", "a\udcff"], ("Error: Invalid value for 'ID': task id a\\udcff is not UTF-8: "
                           "it names no task")),
    (["dlq", "resubmit", "--task", "t", "--of-last", "3"],
     "Error: --halt-after and --of-last need --rate"),
])
def test_the_celery_command_says_what_the_model_says(args: list[str], message: str) -> None:
    result = CliRunner().invoke(jobbers, args, obj=None)
    assert result.exit_code == DlqExit.USAGE, result.output
    assert message in result.output
