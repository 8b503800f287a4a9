"""``celery jobbers``: its output and argument parsing, and the usage errors it raises before
reading the store (no network; the commands against a worker: tests/integration/test_cli.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points
from types import SimpleNamespace

import click
import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery import (
    DeadLetter,
    ErrorInfo,
    Redactor,
    TaskRecord,
    TaskState,
    WorkerInfo,
    install,
    parameters,
    printable,
)
from jobbers_celery.cli import jobbers
from jobbers_celery.cli import output as out
from tests.conftest import free_port

NOW = datetime(2026, 11, 26, 15, 0, 0, 123000, tzinfo=UTC)


def test_the_entry_point_names_the_group() -> None:
    (found,) = [e for e in entry_points(group="celery.commands") if e.name == "jobbers"]
    assert found.value == "jobbers_celery.cli:jobbers"


def test_state_parsing_lists_the_valid_states() -> None:
    assert out.parse_state(" Failed ") is TaskState.FAILED
    assert out.parse_state(None) is None
    with pytest.raises(click.BadParameter, match="valid states: unsubmitted, submitted, "):
        out.parse_state("bogus")


@pytest.mark.parametrize("odd", ["", "bad id", "-x", "a\nb", "x" * 256, "a/b", "é", "..",
                                 "%2F", "<script>", "\x1b[2J", "x" * out.TASK_ID_MAX])
def test_any_task_id_celery_runs_is_taken_as_given(odd: str) -> None:
    assert out.parse_task_id(odd) == odd


def test_only_an_id_over_the_bound_is_refused() -> None:
    with pytest.raises(click.BadParameter, match="task id of 4097 characters: at most 4096"):
        out.parse_task_id("x" * (out.TASK_ID_MAX + 1))


def test_dead_letter_ids() -> None:
    assert out.parse_dead_letter_id("abc") == out.DeadLetterId("abc")
    assert out.parse_dead_letter_id("abc:3") == out.DeadLetterId("abc", 3)
    assert out.parse_dead_letter_id("a:b") == out.DeadLetterId("a:b")
    assert str(out.DeadLetterId("abc", 3)) == "abc:3"


def test_submitted_before_takes_dates_and_ages() -> None:
    assert out.parse_before("7d", NOW) == NOW - timedelta(days=7)
    assert out.parse_before("30m", NOW) == NOW - timedelta(minutes=30)
    assert out.parse_before("2026-11-01", NOW) == datetime(2026, 11, 1, tzinfo=UTC)
    assert out.parse_before("2026-11-01T12:00+02:00", NOW) == datetime(2026, 11, 1, 10,
                                                                        tzinfo=UTC)
    assert out.parse_before("2026-11-01T12:00Z", NOW) == datetime(2026, 11, 1, 12, tzinfo=UTC)
    with pytest.raises(click.BadParameter, match="neither an ISO-8601"):
        out.parse_before("last week", NOW)


def test_one_date_format_for_people_and_iso_for_scripts() -> None:
    assert out.human_date(NOW) == "2026-11-26 15:00:00 UTC"
    assert out.human_date(None) == "-"
    assert out.iso(NOW) == "2026-11-26T15:00:00.123Z"
    assert out.to_json({"b": NOW, "a": 1}) == ('{\n  "a": 1,\n  "b": '
                                               '"2026-11-26T15:00:00.123Z"\n}')


def test_tables_align_and_cut_cells() -> None:
    text = out.table(("ID", "STATE"), [("a", "failed"), ("longer-id", None),
                                       ("x", "y" * 100)])
    lines = text.splitlines()
    assert lines[0] == "ID         STATE"
    assert lines[1] == "a          failed"
    assert lines[2] == "longer-id  -"
    assert lines[3].endswith("...")
    assert len(lines[3]) == 11 + out.MAX_CELL
    assert out.table(("ID",), []) == "(none)"
    assert out.cell("two\nlines") == "two\\nlines"


def test_dead_letters_are_shown_redacted() -> None:
    def login(user: str, password: str) -> None: ...

    entry = DeadLetter(
        task_id="t1", name="proj.login", version=1, queue="q", reason="failed",
        args=["ann", "hunter2-pw"], kwargs={"api_token": "tok-123456", "dsn":
                                            "postgres://u:s3cretpw@db/x"},
        exception_type="ValueError", exception_message="login ann/hunter2-pw refused",
        traceback="Traceback...\nValueError: login ann/hunter2-pw refused\n",
        attempt=2, retry_attempt=0, worker="w1@h", failed_at=NOW)
    shown = out.dead_letter_json(entry, Redactor(), parameters(login), "failed")
    text = out.to_json(shown)
    for secret in ("hunter2-pw", "tok-123456", "s3cretpw"):
        assert secret not in text
    assert shown["args"] == ["ann", "********"]
    assert shown["kwargs"] == {"api_token": "********", "dsn": "********"}  # a secret key
    assert shown["id"] == "t1:2"
    assert shown["failed_at"] == "2026-11-26T15:00:00.123Z"
    row = out.dead_letter_row(shown)
    assert row[0] == "t1:2"
    assert row[6] == "2026-11-26 15:00:00 UTC"
    assert row[7] == "failed"


def test_worker_incarnations() -> None:
    w = WorkerInfo.parse("w1@host:4242:a1b2c3", 1_764_169_200_000, 3)
    assert (w.hostname, w.pid, w.running) == ("w1@host", 4242, 3)
    assert w.last_seen_at == datetime(2025, 11, 26, 15, 0, tzinfo=UTC)


@pytest.mark.parametrize(("args", "message"), [
    (["purge"], "at least one of --name, --queue, --submitted-before"),
    (["tasks", "--state", "nope"], "valid states: unsubmitted"),
    (["show", "x" * 4097], "task id of 4097 characters: at most 4096"),
    (["cancel", "x" * 4097], "task id of 4097 characters"),
    (["resubmit", "ok", "x" * 4097], "task id of 4097 characters"),
    (["tasks", "--limit", "0"], "0 is not in the range"),
    (["dlq", "resubmit"], "give entry ids or at least one filter"),
    (["dlq", "discard", "--yes"], "give entry ids or at least one filter"),
    (["dlq", "resubmit", "--task", "t", "--rate", "0"], "--rate: must be a number"),
    (["dlq", "resubmit", "--task", "t", "--rate", "501"], "at most 500"),
    (["dlq", "resubmit", "--task", "t", "--rate", "1e-300"],
     "--rate: must be a number of tasks per second, at least 0.1"),
    (["dlq", "resubmit", "--task", "t", "--halt-after", "3", "--of-last", "10"],
     "--halt-after and --of-last need --rate"),
    (["dlq", "resubmit", "--task", "t", "--rate", "2", "--halt-after", "3"],
     "--of-last: give halt_after and of_last together"),
    (["dlq", "resubmit", "--task", "t", "--rate", "2", "--halt-after", "11", "--of-last",
      "10"], "--halt-after: must be between 0 and of_last (10)"),
    (["dlq", "resubmit", "--task", "t", "--rate", "2", "--halt-after", "1", "--of-last",
      "1001"], "--of-last: must be between 1 and 1000"),
    (["dlq", "resubmit", "--rate", "2"], "give entry ids or at least one filter"),
    (["dlq", "run", "x"], "'x' is not a valid integer"),
    (["dlq", "run", "0"], "0 is not in the range"),
    (["dlq", "show", "x" * 4097], "task id of 4097 characters"),
    (["show", "a\udcff"], "task id a\\udcff is not UTF-8"),  # the shell's byte 0xff
    (["dlq", "show", "\udcff"], "is not UTF-8"),
])
def test_usage_errors_exit_2_before_the_store_is_read(args: list[str], message: str) -> None:
    # no app, no Redis: these fail before either is looked at
    result = CliRunner().invoke(jobbers, args, obj=None)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_an_unreachable_store_exits_1_with_one_line() -> None:
    app = Celery("cli-unavailable", broker=f"redis://127.0.0.1:{free_port()}/0",
                 set_as_current=False)
    jobbers_ = install(app)
    jobbers_.store.client = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    result = CliRunner().invoke(jobbers, ["status"], obj=SimpleNamespace(app=app))
    assert result.exit_code == 1
    assert result.output.startswith("Error: the jobbers store is unreachable: ConnectionError")


def test_an_app_without_jobbers_exits_1() -> None:
    app = Celery("cli-bare", set_as_current=False)
    result = CliRunner().invoke(jobbers, ["tasks"], obj=SimpleNamespace(app=app))
    assert result.exit_code == 1
    assert "jobbers is not installed on the Celery app 'cli-bare'" in result.output


# ---------------------------------------------------------------------- hostile values
HOSTILE = {
    "title": "\x1b]0;pwned\x07proj.task",  # retitles the terminal
    "clear": "\x1b[2J\x1b[H",  # clears it
    "forged": "ok\rFAILED  forged line\nSTATE  completed",  # overwrites, adds a line
    "bidi": "evil\u202etxt.exe",  # shows reversed
    "c1": "\x9b31mred",  # an 8-bit CSI
}


def _terminal_safe(text: str) -> bool:
    """No character a terminal obeys but the newlines that separate lines and cells."""
    return all(c == "\n" or c.isprintable() for c in text)


def _record(value: str) -> TaskRecord:
    return TaskRecord(task_id=value, name=value, version=1, queue=value,
                      state=TaskState.FAILED, attempt=1, retry_attempt=0, submitted_at=NOW,
                      started_at=None, retried_at=None, completed_at=None,
                      heartbeat_at=None, run_at=None, worker=value,
                      error=ErrorInfo(value, value + "\nline 2"),
                      progress={"note": value}, checkpoint=None)


@pytest.mark.parametrize("value", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_table_and_a_detail_view_show_hostile_values_escaped(value: str) -> None:
    red = Redactor()
    record = _record(value)
    shown = out.record_json(record, red)
    table = out.table(("ID", "NAME", "QUEUE", "WORKER", "ERROR"),
                      [(record.task_id, record.name, record.queue, record.worker,
                        out.error_text(record, red))])
    detail = out.fields([("ID", record.task_id), ("Name", record.name),
                         ("Error", f"{value}: {shown['error']['message']}"),
                         ("Progress", shown["progress"])], blocks=("Error",))
    for text in (table, detail):
        assert _terminal_safe(text), text
        assert printable(value[:10]) in text  # shown, escaped
    assert len(table.splitlines()) == 2  # a header and one row: no forged line
    # every line is a label's, or a line of the error's block, indented below it
    lines = detail.splitlines()
    assert [line.split(":")[0] for line in lines if not line.startswith("    ")] == [
        "ID", "Name", "Error", "Progress"]
    assert "    line 2" in lines


@given(st.text(st.characters(codec=None, exclude_categories=())))
def test_json_output_is_the_same_value_and_terminal_safe(value: str) -> None:
    text = out.to_json({"task_id": value, "n": [value]})
    assert _terminal_safe(text)
    assert json.loads(text) == {"task_id": value, "n": [value]}


@given(st.lists(st.text(st.characters(codec=None, exclude_categories=()), max_size=60),
                min_size=1, max_size=4))
def test_every_table_cell_is_one_escaped_line(values: list[str]) -> None:
    text = out.table([f"H{n}" for n in range(len(values))], [values, values])
    assert _terminal_safe(text)
    assert len(text.splitlines()) == 3


def test_progress_reads_as_on_the_pages() -> None:
    assert out.progress_text({"chunk": 11, "of": 60}) == "chunk 11 of 60 (18%)"
    assert out.progress_text({"done": 3, "total": 8}) == "3 of 8 done (37%)"
    assert out.progress_text({"percent": 40}) == "40%"
    assert out.progress_text(1) == "1"  # a counter, never 100%
    assert out.progress_text({"phase": "upload"}) == "phase: upload"
    assert out.progress_text(None) is None
