"""Tables follow the terminal's width (``jobbers_celery.core.columns``): ``celery jobbers
tasks`` at ``COLUMNS=80`` is at most 80 wide, at 200 it shows every column whole; ids keep
their ends (elided in the middle, with a marker), names lose their middle, text its end.
No network (the app's Jobbers is the in-memory kit's)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from celery import Celery
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery import ErrorInfo, TaskRecord, TaskState
from jobbers_celery.cli import jobbers
from jobbers_celery.cli import output as out
from jobbers_celery.core import columns as columns_mod
from jobbers_celery.core.columns import (
    ELIDED,
    ID_MIN,
    Kind,
    column_kind,
    elide,
    fit_columns,
    terminal_width,
)
from jobbers_celery.testing import in_memory

NOW = datetime(2026, 11, 26, 15, 0, 0, tzinfo=UTC)
TASK_ID = "5f0c7a1e-1b2c-4d3e-8f90-0123456789ab"
NAME = "shop.import_catalog_from_partner_feed"


def _record(n: int) -> TaskRecord:
    return TaskRecord(
        task_id=f"{TASK_ID[:-2]}{n:02d}", name=NAME, version=1, queue="imports",
        state=TaskState.FAILED, attempt=3, retry_attempt=2, submitted_at=NOW,
        started_at=None, retried_at=None, completed_at=None, heartbeat_at=None, run_at=None,
        worker="imports-b@worker-host-17.internal",
        error=ErrorInfo("ValueError", "upstream rejected row 4711 of catalog-42 because "
                        "the price was negative"),
        progress=None, checkpoint=None)


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Celery:
    app = Celery("cli-width", broker="memory://", set_as_current=False)
    found = in_memory(app)
    monkeypatch.setattr(found, "tasks", lambda *a, **k: [_record(n) for n in range(3)])
    return app


def _tasks(app: Celery, columns: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(columns_mod, "stdout_is_terminal", lambda: True)  # as in a terminal
    result = CliRunner().invoke(jobbers, ["tasks"], obj=SimpleNamespace(app=app))
    assert result.exit_code == 0, result.output
    return result.output


def test_tasks_fit_80_columns(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _tasks(app, 80, monkeypatch)
    print(f"\n$ COLUMNS=80 celery jobbers tasks\n{text}")
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].split()[:3] == ["ID", "NAME", "STATE"]
    assert f"{TASK_ID[:-2]}00" in lines[1]  # ids whole at 80: they are what `show` takes
    assert ELIDED in lines[1]  # the name and the error give up their room
    assert lines[-1] == "(hidden at this width: WORKER, ATTEMPT, QUEUE, SUBMITTED; --json has all)"


def test_tasks_at_200_columns_show_everything(app: Celery,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    text = _tasks(app, 200, monkeypatch)
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "QUEUE", "ATTEMPT", "WORKER",
                                "SUBMITTED", "ERROR"]
    assert NAME in lines[1]
    assert "imports-b@worker-host-17.internal" in lines[1]
    assert max(len(line) for line in lines) <= 200
    assert "hidden" not in text


def test_a_pipe_is_never_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # pytest-xdist's workers export it, for one
    assert terminal_width() is None  # pytest's stdout is captured: not a terminal
    monkeypatch.setattr(columns_mod, "stdout_is_terminal", lambda: True)
    assert terminal_width() == 80
    monkeypatch.setenv("COLUMNS", "132")
    assert terminal_width() == 132


def test_kinds_and_elision() -> None:
    assert column_kind("ID") is column_kind("TASK ID") is Kind.ID
    assert column_kind("NAME") is column_kind("WORKER") is Kind.NAME
    assert column_kind("SUBMITTED") is column_kind("FAILED AT") is Kind.KEEP
    assert column_kind("ERROR") is Kind.TEXT
    assert elide(NAME, 20, Kind.NAME) == "shop.impo...ner_feed"
    assert elide(TASK_ID, ID_MIN, Kind.ID) == "5f0c7...789ab"
    assert elide("ValueError: boom boom", 12, Kind.TEXT) == "ValueErro..."
    assert elide("short", 12, Kind.ID) == "short"


def test_when_nothing_fits_the_table_is_as_narrow_as_it_goes() -> None:
    shown, rows, dropped = fit_columns(["ID", "STATE"], [[TASK_ID, "failed"]], 5)
    assert shown == ["ID", "STATE"]
    assert dropped == []
    assert rows == [[elide(TASK_ID, ID_MIN, Kind.ID), "failed"]]


_CELL = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=70)


@given(st.integers(20, 240), st.lists(st.tuples(_CELL, _CELL, _CELL, _CELL), min_size=1,
                                      max_size=4))
def test_a_table_never_exceeds_a_width_its_floors_fit(width: int,
                                                      rows: list[tuple[str, ...]]) -> None:
    headers = ("ID", "NAME", "STATE", "ERROR")
    text = out.table(headers, rows, optional=("STATE",), width=width)
    lines = text.splitlines()
    # one line per row (plus the header and a note), never wider than asked when the
    # narrowest layout fits (ID 13 + NAME 10 + ERROR 8 + gaps)
    assert len(lines) in (len(rows) + 1, len(rows) + 2)
    if width >= ID_MIN + 10 + 8 + 4:
        assert max(len(line) for line in lines[:len(rows) + 1]) <= width
