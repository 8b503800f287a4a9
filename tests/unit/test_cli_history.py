"""``celery jobbers history`` on the in-memory kit (no Redis): the same points as
``Jobbers.series`` in ``--json``, the human form's totals and busy buckets, a hostile task
name printed escaped, and usage errors that exit 2 before the store is read."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

from jobbers_celery import TaskState
from jobbers_celery.cli import jobbers as cli
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory

S = TaskState
HOSTILE = "shop.\x1b]0;pwned\x07evil\u202e"


def run(app: Celery | None, *args: str) -> Any:
    return CliRunner().invoke(cli, ["history", *args],
                              obj=SimpleNamespace(app=app) if app else None)


def _task(store: InMemoryStore, task_id: str, name: str, to: TaskState) -> None:
    assert store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name=name,
                        create={"name": name, "queue": "celery", "ver": "1"}).applied
    store.advance(0.5)
    assert store.start(task_id, name=name, worker="w1", wid="w1:1", heartbeat_ms=None,
                       cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={}).applied
    store.advance(2)
    assert store.end(task_id, to, fence=1, wid="w1:1", name=name, worker="w1",
                     reason="done").applied


@pytest.fixture
def app() -> Celery:
    app = Celery("cli-history", broker="memory://", set_as_current=False)
    store = InMemoryStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    for i in range(3):
        _task(store, f"ok-{i}", "shop.import", S.COMPLETED)
    _task(store, "ko", "shop.import", S.FAILED)
    _task(store, "h", HOSTILE, S.FAILED)
    return app


def test_json_is_the_series(app: Celery) -> None:
    result = run(app, "--name", "shop.import", "--since", "30m", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["name"] == "shop.import"
    assert sum(p["completed"] for p in shown["points"]) == 3
    assert sum(p["failed"] for p in shown["points"]) == 1
    busy = [p for p in shown["points"] if p["throughput"]]
    assert busy
    assert all(2000 <= p["mean_runtime_ms"] < 3000 for p in busy)
    assert all(500 <= p["mean_latency_ms"] < 1500 for p in busy)


def test_human_form_and_names(app: Celery) -> None:
    result = run(app, "--queue", "celery", "--since", "2h", "--step", "15")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "queue celery" in text
    assert "5 (3 completed, 2 failed, 40.0% failed)" in text
    assert "buckets without work not shown" in text
    names = run(app, "--names")
    assert names.exit_code == 0, names.output
    assert "shop.import" in names.output
    assert "\\x1b]0;pwned\\x07evil\\u202e" in names.output  # escaped, not obeyed
    assert "\x1b" not in names.output


@pytest.mark.parametrize(("args", "message"), [
    (["--name", "a", "--queue", "b"], "not both"),
    (["--since", "1w"], "not a span"),
    (["--until", "soon"], "not a span"),
    (["--step", "7"], "is not one of"),
    (["--name", ""], "empty, or too long"),
])
def test_usage_errors_exit_2_before_the_store_is_read(args: list[str], message: str) -> None:
    result = run(None, *args)  # no app: these fail before it is looked at
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_refused_range_exits_2(app: Celery) -> None:
    result = run(app, "--since", "7d", "--step", "1")
    assert result.exit_code == 2, result.output
    assert "at most 1500 a read" in result.output
