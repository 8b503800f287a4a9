"""``celery -A tests.integration.chord_proj jobbers workflow ID`` through real subprocesses,
against a real prefork worker and the session's private Redis: a completed chain, a chord
whose header member failed into the DLQ (blocking, marked ``*``) repaired with
``--resubmit`` until its callback ran, a running chord cancelled with ``--cancel``; each in
the human form and with ``--json``; exit codes 1, 2, 3."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import chain, chord

from jobbers_celery import TaskState, get_jobbers
from tests.conftest import ROOT, Worker, start_worker, subprocess_env, wait_for
from tests.integration.lifecycle_helpers import wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
MODULE = "tests.integration.chord_proj"


class Run:
    def __init__(self, args: tuple[str, ...], proc: subprocess.CompletedProcess[str]) -> None:
        self.args, self.rc, self.out, self.err = args, proc.returncode, proc.stdout, proc.stderr

    def json(self) -> Any:
        return json.loads(self.out)


def cli(*args: str) -> Run:
    """``celery -A tests.integration.chord_proj jobbers ARGS`` (no terminal, no input)."""
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", MODULE, "jobbers", *args], cwd=ROOT,
        env=subprocess_env({"NO_COLOR": "1"}), input="", capture_output=True, text=True,
        timeout=60, check=False)
    return Run(args, proc)


def ok(run: Run) -> Run:
    assert run.rc == 0, f"{run.args} exited {run.rc}:\n{run.out}\n{run.err}"
    return run


@pytest.fixture(scope="module")
def app(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The chord tests' jobbers app with one prefork worker for the module."""
    import importlib

    chord_app = importlib.import_module(MODULE).app
    worker: Worker = start_worker(chord_app, MODULE, tmp_path_factory.mktemp("wf-cli"))
    yield chord_app
    worker.kill()


def tasks(app: Any) -> tuple[Any, Any, Any]:
    name = app.main
    return app.tasks[f"{name}.member"], app.tasks[f"{name}.collect"], app.tasks[f"{name}.add"]


def fix(app: Any, key: str) -> None:
    client = redis.Redis.from_url(app.conf.broker_url)
    client.set(key, "fixed")
    client.close()


def test_a_completed_chain(app: Any) -> None:
    _, _, add = tasks(app)
    result = chain(add.si(1, 2), add.si(3, 4), add.si(5, 6)).apply_async()
    assert result.get(timeout=20) == 11
    last = result.id
    first = result.parent.parent.id
    jobbers = get_jobbers(app)
    wait_for(lambda: jobbers.workflow(last).state.value == "completed", timeout=20)
    human, shown = ok(cli("workflow", first)), ok(cli("workflow", last, "--json")).json()
    assert (shown["state"], shown["total"], shown["completed"], shown["blocking"]) == (
        "completed", 3, 3, [])
    assert shown["root_id"] == first
    assert [m["record"]["state"] for m in shown["members"]] == ["completed"] * 3
    assert [m["role"] for m in shown["members"]] == ["root", "member", "member"]
    assert shown["members"][1]["parent_id"] == first
    assert all(m["elapsed_seconds"] is not None for m in shown["members"])
    assert shown["ended_at"] is not None
    assert shown["history"][-1]["state"] == "completed"
    lines = human.out.splitlines()
    assert lines[:2] == [f"Workflow: {first}", "State:    completed"]
    assert "Progress: 3 of 3 completed, 0 failed, 0 running, 0 pending, 0 cancelled" in lines
    assert not [line for line in lines if line.startswith("* ")]  # nothing blocks it


def test_a_chord_held_by_a_failed_member_is_repaired_with_resubmit(app: Any) -> None:
    member, collect, _ = tasks(app)
    key = f"flag-{uuid.uuid4().hex}"
    header = [member.s(0), member.s(1, key), member.s(2)]
    ids = [str(uuid.uuid4()) for _ in header]
    for sig, task_id in zip(header, ids, strict=True):
        sig.set(task_id=task_id)
    result = chord(header)(collect.s())
    jobbers = get_jobbers(app)
    wait_state(jobbers, ids[1], S.FAILED)
    wait_for(lambda: jobbers.workflow(ids[0]).state.value == "failed", timeout=20)

    human, shown = ok(cli("workflow", ids[0])), ok(cli("workflow", ids[2], "--json")).json()
    assert (shown["state"], shown["failed"], shown["completed"], shown["blocking"]) == (
        "failed", 1, 2, [ids[1]])
    assert {m["task_id"]: m["role"] for m in shown["members"]} == dict.fromkeys(ids, "header")
    assert [m["blocking"] for m in shown["members"]] == [m["task_id"] == ids[1]
                                                         for m in shown["members"]]
    failed = next(m for m in shown["members"] if m["task_id"] == ids[1])
    assert failed["record"]["error"]["type"] == "ValueError"
    marked = [line for line in human.out.splitlines() if line.startswith("* ")]
    assert len(marked) == 1
    assert ids[1][:20] in marked[0]
    assert " failed " in marked[0]
    assert f"Blocking: {ids[1]} (chordj.member, failed)" in human.out

    fix(app, key)  # the cause fixed, the failed member is resubmitted
    repaired = ok(cli("workflow", ids[0], "--resubmit", "--yes", "--json")).json()
    assert repaired == {"task_id": ids[0], "root_id": shown["root_id"],
                        "resubmitted": [ids[1]], "reset_retry_count": True,
                        "confirmed": True}
    assert result.get(timeout=20, follow_parents=False) == [0, 10, 20]
    wait_for(lambda: jobbers.workflow(ids[0]).state.value == "completed", timeout=20)
    after = ok(cli("workflow", result.id, "--json")).json()
    assert (after["state"], after["total"], after["completed"]) == ("completed", 4, 4)
    assert {m["task_id"]: m["role"] for m in after["members"]}[result.id] == "callback"
    assert [h["state"] for h in after["history"]][-1] == "completed"
    again = cli("workflow", ids[0], "--resubmit", "--yes")
    assert again.rc == 1
    assert "has no failed member to resubmit" in again.err


def test_a_waiting_chord_is_cancelled(app: Any) -> None:
    member, collect, _ = tasks(app)
    nobody = f"nobody-{uuid.uuid4().hex}"  # a queue no worker consumes: they wait
    header = [member.s(0), member.s(1)]
    ids = [str(uuid.uuid4()) for _ in header]
    for sig, task_id in zip(header, ids, strict=True):
        sig.set(task_id=task_id, queue=nobody)
    chord(header)(collect.s())
    jobbers = get_jobbers(app)
    waiting = ok(cli("workflow", ids[0], "--json")).json()
    # the two header members, and the callback they will publish (expected, not recorded)
    assert (waiting["state"], waiting["pending"], waiting["total"]) == ("running", 3, 3)
    assert sorted(waiting["blocking"]) == sorted(ids)  # nothing runs: the waiting hold it
    asked = cli("workflow", ids[0], "--cancel")  # no terminal, no answer: not confirmed
    assert asked.rc == 0
    assert "Nothing cancelled." in asked.out
    assert "Progress: 0 of 3 completed" in asked.err
    assert jobbers.get(ids[0]).state is S.SUBMITTED
    done = ok(cli("workflow", ids[0], "--cancel", "--yes", "--json")).json()
    assert sorted(done["cancelled"]) == sorted(ids)
    assert done["terminate"] is False
    assert {jobbers.get(i).state for i in ids} == {S.CANCELLED}
    after = ok(cli("workflow", ids[1], "--json")).json()
    assert (after["state"], after["cancelled"]) == ("cancelled", 2)
    assert "cancelled" in [h["state"] for h in after["history"]]
    refused = cli("workflow", ids[0], "--cancel", "--yes")
    assert refused.rc == 1
    assert "no member left to cancel" in refused.err


def test_exit_codes(app: Any) -> None:
    unknown = cli("workflow", f"no-such-{uuid.uuid4().hex}")
    assert unknown.rc == 3
    assert "no workflow has the id no-such-" in unknown.err
    both = cli("workflow", "x", "--cancel", "--resubmit")
    assert both.rc == 2
    assert "give --cancel or --resubmit, not both" in both.err
