"""``celery jobbers workflow ID``: a canvas as one unit on the command line, with the
in-memory kit (a real chain, group and chord run on an embedded worker, no Redis); usage
errors (exit 2) before the store is read; hostile values printed escaped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from click.testing import CliRunner

from jobbers_celery import (
    ErrorInfo,
    Jobbers,
    JobbersTask,
    TaskRecord,
    TaskState,
    Workflow,
    WorkflowMember,
    WorkflowState,
    WorkflowTransition,
    printable,
)
from jobbers_celery.cli import jobbers as cli
from jobbers_celery.cli.workflow import BLOCKS, duration
from jobbers_celery.testing import (
    InMemoryDeadLetterSink,
    InMemoryStore,
    embedded_worker,
    in_memory,
)
from tests.conftest import wait_for

S = TaskState
W = WorkflowState
NOW = datetime(2026, 11, 26, 15, 0, 0, tzinfo=UTC)


def run(app: Celery | None, *args: str, stdin: str = "") -> Any:
    return CliRunner().invoke(cli, list(args), obj=SimpleNamespace(app=app) if app else None,
                              input=stdin)


# ---------------------------------------------------------------------- usage
@pytest.mark.parametrize(("args", "message"), [
    (["workflow", "x", "--cancel", "--resubmit"], "give --cancel or --resubmit, not both"),
    (["workflow", "x", "--terminate"], "--terminate goes with --cancel"),
    (["workflow", "x", "--keep-retry-count"], "--keep-retry-count goes with --resubmit"),
    (["workflow", "x" * 4097], "task id of 4097 characters"),
    (["workflow", "a\udcff"], "is not UTF-8"),
    (["workflow", "x", "--limit", "0"], "0 is not in the range"),
    (["workflow"], "Missing argument 'ID'"),
])
def test_usage_errors_exit_2_before_the_store_is_read(args: list[str], message: str) -> None:
    result = run(None, *args)  # no app: these fail before it is looked at
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_durations() -> None:
    assert duration(None) is None
    assert duration(timedelta(seconds=0.42)) == "420 ms"
    assert duration(timedelta(seconds=4.25)) == "4.2s"
    assert duration(timedelta(seconds=42)) == "42s"
    assert duration(timedelta(seconds=185)) == "3m 05s"
    assert duration(timedelta(hours=1, minutes=2, seconds=3)) == "1h 02m"


# ---------------------------------------------------------------------- hostile values
HOSTILE = "\x1b]0;pwned\x07ok\rFAILED forged\n\u202eevil\x9b31m"


def _record(task_id: str, state: TaskState, **over: Any) -> TaskRecord:
    values: dict[str, Any] = {
        "task_id": task_id, "name": HOSTILE, "version": None, "queue": HOSTILE,
        "state": state, "attempt": 1, "retry_attempt": 0, "submitted_at": NOW,
        "started_at": NOW, "retried_at": None,
        "completed_at": NOW + timedelta(seconds=3) if state is not S.STARTED else None,
        "heartbeat_at": None, "run_at": None, "worker": HOSTILE,
        "error": ErrorInfo(HOSTILE, HOSTILE + " password=hunter2") if state is S.FAILED
        else None, "progress": {"note": HOSTILE, "token": "s3cret"}, "checkpoint": None}
    values.update(over)
    return TaskRecord(**values)


def hostile_workflow() -> Workflow:
    root, failed = HOSTILE + "root", HOSTILE + "header"
    members = [
        WorkflowMember(_record(root, S.COMPLETED), None, None, "root"),
        WorkflowMember(_record(failed, S.FAILED), root, HOSTILE + "group", "header"),
        WorkflowMember(_record(HOSTILE + "running", S.STARTED), root, HOSTILE + "group",
                       "header"),
    ]
    return Workflow(
        root_id=root, state=W.RUNNING, members=members, total=4, completed=1, failed=1,
        running=1, pending=1, cancelled=0, started_at=NOW, ended_at=None,
        elapsed=timedelta(seconds=75), blocking=[failed],
        history=[WorkflowTransition(NOW, W.RUNNING, HOSTILE + " started", root)],
        truncated=True)


@pytest.fixture
def faked(monkeypatch: pytest.MonkeyPatch) -> Celery:
    """An app whose Jobbers answers the hostile workflow for any id."""
    app = Celery("cli-workflow-hostile", broker="memory://", set_as_current=False)
    in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())
    flow = hostile_workflow()
    monkeypatch.setattr(Jobbers, "workflow", lambda self, task_id, limit=1000: flow)
    monkeypatch.setattr(Jobbers, "now", lambda self: NOW + timedelta(seconds=75))
    return app


def _terminal_safe(text: str) -> bool:
    return all(c == "\n" or c.isprintable() for c in text)


def test_hostile_values_are_printed_escaped(faked: Celery) -> None:
    result = run(faked, "workflow", "any")
    assert result.exit_code == 0, result.output
    text = result.output
    assert _terminal_safe(text), text
    assert printable(HOSTILE)[:20] in text
    assert "hunter2" not in text
    assert "s3cret" not in text
    lines = text.splitlines()
    assert lines[0].startswith("Workflow:")
    assert ("(only the first 3 members are listed, and the history is theirs; the state "
            "and counts cover all; --limit reads more)") in text
    assert "Progress: 1 of 4 completed, 1 failed, 1 running, 1 pending, 0 cancelled" in text
    assert "Elapsed:  1m 15s" in text
    members = lines[lines.index(next(x for x in lines if x.startswith("Members"))) + 1:]
    marked = [line for line in members[1:4] if line.startswith(BLOCKS)]
    assert len(marked) == 1
    assert "header" in marked[0]
    assert "failed" in marked[0]


def test_hostile_values_in_json_are_the_same_values_and_terminal_safe(faked: Celery) -> None:
    result = run(faked, "workflow", "any", "--json")
    assert result.exit_code == 0, result.output
    assert _terminal_safe(result.output)
    body = json.loads(result.output)
    assert body["root_id"] == HOSTILE + "root"
    assert body["blocking"] == [HOSTILE + "header"]
    assert [m["blocking"] for m in body["members"]] == [False, True, False]
    assert [m["role"] for m in body["members"]] == ["root", "header", "header"]
    assert body["members"][1]["record"]["name"] == HOSTILE
    assert body["members"][1]["record"]["progress"]["token"] != "s3cret"
    assert "hunter2" not in result.output
    assert (body["total"], body["completed"], body["failed"], body["running"],
            body["pending"], body["cancelled"]) == (4, 1, 1, 1, 1, 0)
    assert body["elapsed_seconds"] == 75.0
    assert body["members"][2]["elapsed_seconds"] == 75.0  # running: to now
    assert body["members"][0]["elapsed_seconds"] == 3.0
    assert body["truncated"] is True
    assert body["history"] == [{"at": "2026-11-26T15:00:00.000Z", "state": "running",
                                "task_id": HOSTILE + "root", "reason": HOSTILE + " started"}]


def test_actions_ask_first_and_no_answer_is_no(faked: Celery, monkeypatch) -> None:
    called: list[str] = []
    monkeypatch.setattr(Jobbers, "cancel_workflow",
                        lambda self, task_id, terminate=False: called.append(task_id) or [])
    result = run(faked, "workflow", "any", "--cancel")  # no input: not confirmed
    assert result.exit_code == 0, result.output
    assert "Nothing cancelled." in result.output
    assert called == []
    refused = run(faked, "workflow", "any", "--cancel", "--yes", "--json")
    assert refused.exit_code == 1
    assert called == ["any"]
    assert json.loads(refused.output.split("Error:")[0])["cancelled"] == []
    assert "no member left to cancel" in refused.output
    assert _terminal_safe(refused.output)


# ---------------------------------------------------------------------- real canvases
kit = Celery("cli_workflow", broker="memory://", backend="cache+memory://")
kit.conf.broker_transport_options = {"polling_interval": 0.01}
FLAGS: set[str] = set()  # the member keys "fixed" (what an operator fixes before a resubmit)


@kit.task(base=JobbersTask, bind=True, name="wf.member", dead_letter_policy="save",
          shared=False)
def member(self: JobbersTask, i: int, key: str = "") -> int:
    if key and key not in FLAGS:
        raise ValueError(f"member {i}: {key} is not fixed")
    return i * 10


@kit.task(base=JobbersTask, bind=True, name="wf.collect", shared=False)
def collect(self: JobbersTask, results: list[int]) -> int:
    return sum(results)


@pytest.fixture(scope="module")
def kit_jobbers() -> Iterator[Jobbers]:
    jobbers = in_memory(kit, InMemoryStore(), InMemoryDeadLetterSink())
    with embedded_worker(kit, shutdown_timeout=30):
        yield jobbers


def _state(jobbers: Jobbers, task_id: str, state: str) -> None:
    def reached() -> bool:
        flow = jobbers.workflow(task_id)
        return flow is not None and flow.state.value == state
    wait_for(reached, timeout=20)


def test_a_chain_run_on_the_kit_is_one_completed_workflow(kit_jobbers: Jobbers) -> None:
    result = chain(member.si(1), member.si(2), member.si(3)).apply_async()
    first = result.parent.parent.id
    _state(kit_jobbers, result.id, "completed")
    shown = json.loads(run(kit, "workflow", result.id, "--json").output)
    assert (shown["root_id"], shown["state"], shown["total"], shown["completed"]) == (
        first, "completed", 3, 3)
    assert [m["role"] for m in shown["members"]] == ["root", "member", "member"]
    human = run(kit, "workflow", first)
    assert human.exit_code == 0, human.output
    assert "Progress: 3 of 3 completed, 0 failed" in human.output
    assert not [line for line in human.output.splitlines() if line.startswith(BLOCKS)]
    # an ended workflow is left as it is (cancel_workflow would mark it cancelled)
    refused = run(kit, "workflow", first, "--cancel", "--yes")
    assert refused.exit_code == 1
    assert "is completed: no member left to cancel" in refused.output
    flow = kit_jobbers.workflow(first)
    assert flow is not None
    assert flow.state is W.COMPLETED


def test_a_chord_held_by_a_failed_member_is_resubmitted_from_the_cli(kit_jobbers: Jobbers
                                                                     ) -> None:
    key = "flag-chord"
    header = group(member.s(0), member.s(1, key), member.s(2))
    result = chord(header)(collect.s())
    first = result.parent.results[0].id  # the callback is recorded once it is published
    _state(kit_jobbers, first, "failed")
    flow = kit_jobbers.workflow(first)
    assert flow is not None
    (failed,) = flow.blocking
    human = run(kit, "workflow", failed)
    marked = [line for line in human.output.splitlines() if line.startswith(BLOCKS)]
    assert len(marked) == 1
    assert failed[:20] in marked[0]
    assert "header" in marked[0]
    FLAGS.add(key)
    repaired = run(kit, "workflow", failed, "--resubmit", "--yes")
    assert repaired.exit_code == 0, repaired.output
    assert f"1 failed member(s) resubmitted (retry count reset)\nID\n{failed}" in \
        repaired.output
    _state(kit_jobbers, failed, "completed")
    after = json.loads(run(kit, "workflow", failed, "--json").output)
    assert after["completed"] == after["total"] == 4
    assert [m["role"] for m in after["members"]].count("callback") == 1
    again = run(kit, "workflow", failed, "--resubmit", "--yes")
    assert again.exit_code == 1
    assert "has no failed member to resubmit" in again.output


def test_an_unknown_id_exits_3(kit_jobbers: Jobbers) -> None:
    result = run(kit, "workflow", "no-such-workflow")
    assert result.exit_code == 3
    assert "no workflow has the id no-such-workflow" in result.output


def test_an_ended_workflow_is_not_cancelled(faked: Celery, monkeypatch) -> None:
    import dataclasses

    ended = dataclasses.replace(hostile_workflow(), state=W.COMPLETED)
    monkeypatch.setattr(Jobbers, "workflow", lambda self, task_id, limit=1000: ended)
    called: list[str] = []
    monkeypatch.setattr(Jobbers, "cancel_workflow",
                        lambda self, task_id, terminate=False: called.append(task_id) or [])
    refused = run(faked, "workflow", "any", "--cancel")  # not even asked
    assert refused.exit_code == 1
    assert "is completed: no member left to cancel" in refused.output
    assert called == []
