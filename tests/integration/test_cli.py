"""``celery -A tests.integration.proj jobbers ...`` through real subprocesses, against one real
worker (prefork) and the session's private Redis.

The command is found through the ``celery.commands`` entry point: the package must be
installed (``pip install -e .``), as for any Celery sub-command. Each command runs once in its
human form and once with ``--json``; the error cases check their exit codes (2 bad input,
3 not found, 1 an action that did not apply); a secret argument is never printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from jobbers_celery import TaskState, printable
from tests.conftest import (
    ROOT,
    RedisServer,
    Worker,
    start_worker,
    subprocess_env,
    wait_for,
)
from tests.integration.lifecycle_helpers import wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
SECRET = "hunter2-cli-" + uuid.uuid4().hex[:8]


@dataclass
class Run:
    args: tuple[str, ...]
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class World:
    proj: Any
    worker: Worker


def cli(*args: str, stdin: str | None = None) -> Run:
    """``celery -A tests.integration.proj jobbers ARGS`` (no terminal: prompts read stdin)."""
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "jobbers", *args],
        cwd=ROOT, env=subprocess_env({"NO_COLOR": "1"}), input=stdin or "",
        capture_output=True, text=True, timeout=60, check=False)
    run = Run(args, proc.returncode, proc.stdout, proc.stderr)
    assert SECRET not in run.out + run.err, f"secret printed by {args}"
    if "No such command 'jobbers'" in run.err:
        pytest.fail("celery has no `jobbers` command: install the package so that its "
                    "celery.commands entry point exists (pip install -e .)", pytrace=False)
    return run


def many(*commands: Sequence[str]) -> list[Run]:
    """Independent read-only commands, a few at a time."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: cli(*c), commands))


def ok(run: Run) -> Run:
    assert run.rc == 0, f"{run.args} exited {run.rc}:\n{run.out}\n{run.err}"
    return run


@pytest.fixture(scope="module")
def world(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    """One worker for the module (its tasks use unique ids, so tests do not meet)."""
    import importlib

    import redis

    client = redis.Redis.from_url(redis_server.url())
    client.flushdb()
    proj = importlib.import_module("tests.integration.proj")
    worker = start_worker(proj.app, "tests.integration.proj", tmp_path_factory.mktemp("cli"))
    yield World(proj, worker)
    worker.kill()
    client.flushdb()
    client.close()


def _failed(world: World) -> str:
    """A task of ``proj.boom`` (a secret keyword argument) failed and dead-lettered."""
    task_id = f"boom-{uuid.uuid4().hex[:8]}"
    world.proj.boom.apply_async(kwargs={"secret": SECRET}, task_id=task_id)
    wait_state(world.proj.jobbers, task_id, S.FAILED, worker=world.worker)
    return task_id


def test_reads_and_cancel_in_both_forms(world: World) -> None:
    proj, j = world.proj, world.proj.jobbers
    added = f"add-{uuid.uuid4().hex[:8]}"
    later = f"flaky-{uuid.uuid4().hex[:8]}"
    asleep = f"sleepy-{uuid.uuid4().hex[:8]}"
    proj.add.apply_async((2, 3), task_id=added)
    proj.flaky.apply_async((2, 300), task_id=later)  # fails, then waits 300 s to retry
    proj.sleepy.apply_async((60,), task_id=asleep)
    failed = _failed(world)
    wait_state(j, added, S.COMPLETED)
    wait_state(j, later, S.SCHEDULED)
    wait_state(j, asleep, S.STARTED)
    host = world.worker.name

    (status, status_j, tasks, tasks_j, filtered_j, show, show_j, sched, sched_j, dl, dl_j,
     dls, dls_j) = map(ok, many(
        ["status"], ["status", "--json"], ["tasks"], ["tasks", "--state", "failed", "--json"],
        ["tasks", "--name", "proj.add", "--queue", "celery", "--worker", host, "--json"],
        ["show", failed], ["show", failed, "--json"], ["scheduled"], ["scheduled", "--json"],
        ["dlq", "list"], ["dlq", "list", "--task", "proj.boom", "--json"],
        ["dlq", "show", failed], ["dlq", "show", failed, "--json"]))

    data = status_j.json()
    assert data["counts"]["completed"] >= 1
    assert data["counts"]["failed"] >= 1
    assert data["scheduled"] >= 1
    assert data["next_run_at"].endswith("Z")
    assert [(w["hostname"], w["running"]) for w in data["workers"]] == [(host, 1)]  # sleepy
    assert set(data["cleaner"]) == {"last_run_at", "last_duration_ms", "by", "overdue"}
    assert "Live workers:      1" in status.out
    assert host in status.out
    assert status.out.splitlines()[0].split() == ["STATE", "TASKS"]

    lines = tasks.out.splitlines()
    assert lines[0].split()[:3] == ["ID", "NAME", "STATE"]
    ids = [line.split()[0] for line in lines[1:]]
    # newest first (by first submission; two publishes in one millisecond may come either way)
    shown = [i for i in ids if i in (failed, asleep, added)]
    assert sorted(shown) == sorted([failed, asleep, added])
    submitted = [j.get(i).submitted_at for i in shown]
    assert submitted == sorted(submitted, reverse=True)
    assert [t["task_id"] for t in tasks_j.json()] == [failed]
    assert [(t["task_id"], t["worker"]) for t in filtered_j.json()] == [(added, host)]

    assert "State:         failed" in show.out
    assert "started      failed" in show.out
    shown = show_j.json()
    assert shown["task_id"] == failed
    assert shown["record"]["state"] == "failed"
    assert shown["record"]["error"]["type"] == "ValueError"
    assert [(h["from_state"], h["to_state"]) for h in shown["transitions"]] == [
        ("unsubmitted", "submitted"), ("submitted", "started"), ("started", "failed")]

    assert later in sched.out
    assert "RUN AT" in sched.out
    assert [t["task_id"] for t in sched_j.json()] == [later]

    assert f"{failed}:1" in dl.out
    assert "TASK NOW" in dl.out
    entry = next(e for e in dl_j.json() if e["task_id"] == failed)
    assert entry["kwargs"] == {"secret": "********"}
    assert entry["task_state_now"] == "failed"
    assert "Kwargs:        {\"secret\": \"********\"}" in dls.out
    assert dls_j.json()["id"] == f"{failed}:1"
    assert "Traceback" in dls_j.json()["traceback"]

    scheduled_cancel = ok(cli("cancel", later, "--json")).json()
    assert scheduled_cancel == {"task_id": later, "cancelled": True, "outcome": "cancelled",
                                "state": "cancelled", "terminate": False}
    running_cancel = ok(cli("cancel", asleep, "--terminate"))
    assert running_cancel.out.startswith(f"{asleep}: cancellation requested")
    wait_state(j, asleep, S.CANCELLED, worker=world.worker)
    done = cli("cancel", added)
    assert done.rc == 1
    assert "completed: nothing to cancel" in done.err


def test_bad_input_and_not_found_exit_codes(world: World) -> None:
    # (the other usage errors, raised before the store is read: tests/unit/test_cli.py)
    bad_state, bad_id, no_criteria, unknown, dlq_unknown, resubmit_unknown = many(
        ["tasks", "--state", "bogus"], ["show", "x" * 4097], ["purge"], ["show", "no-such-task"],
        ["dlq", "show", "no-such-task"], ["resubmit", "no-such-task", "--json"])
    assert bad_state.rc == 2
    assert "valid states: unsubmitted, submitted" in bad_state.err
    assert bad_id.rc == 2
    assert "task id of 4097 characters: at most 4096" in bad_id.err
    assert no_criteria.rc == 2
    assert "at least one of --name, --queue" in no_criteria.err
    assert unknown.rc == 3
    assert "no task no-such-task" in unknown.err
    assert dlq_unknown.rc == 3
    assert "no dead-letter entry for no-such-task" in dlq_unknown.err
    assert resubmit_unknown.rc == 3
    assert resubmit_unknown.json() == {"resubmitted": [],
                                       "skipped": [{"task_id": "no-such-task",
                                                    "why": "unknown task"}]}


def test_resubmit_purge_and_clean(world: World) -> None:
    j = world.proj.jobbers
    failed = _failed(world)
    human = ok(cli("resubmit", failed))
    assert human.out.split() == ["ID", "OUTCOME", failed, "resubmitted"]
    assert wait_state(j, failed, S.FAILED).attempt == 2
    assert ok(cli("resubmit", failed, "--json")).json() == {"resubmitted": [failed],
                                                            "skipped": []}
    assert wait_state(j, failed, S.FAILED).attempt == 3

    queue = f"q-{uuid.uuid4().hex[:6]}"  # no worker consumes it: the task stays submitted
    waiting = f"wait-{uuid.uuid4().hex[:8]}"
    world.proj.add.apply_async((1, 1), task_id=waiting, queue=queue)
    declined = ok(cli("purge", "--queue", queue, stdin="n\n"))
    assert f"queue:            {queue}" in declined.err
    assert "[y/N]" in declined.err
    assert declined.out.strip() == "Nothing purged."
    assert j.get(waiting).state is S.SUBMITTED
    purged = ok(cli("purge", "--queue", queue, "--submitted-before", "0m", "--yes", "--json"))
    assert purged.json()["cancelled"] == [waiting]
    assert purged.json()["purged"] is True
    assert j.get(waiting).state is S.CANCELLED

    clean, clean_j = map(ok, many(["clean"], ["clean", "--json"]))
    assert "Examined:" in clean.out
    assert "By:            clean()" in clean.out
    assert clean_j.json()["by"] == "clean()"
    assert clean_j.json()["at"].endswith("Z")


def test_dlq_resubmit_dry_run_and_discard(world: World) -> None:
    j = world.proj.jobbers
    failed = _failed(world)
    before = (j.get(failed), len(j.history(failed)))

    dry, dry_j = map(ok, many(["dlq", "resubmit", "--task", "proj.boom", "--dry-run"],
                              ["dlq", "resubmit", failed, "--dry-run", "--json"]))
    assert "Dry run: would resubmit" in dry.out
    assert f"{failed}:1" in dry.out
    assert [e["id"] for e in dry_j.json()["entries"]] == [f"{failed}:1"]
    assert (j.get(failed), len(j.history(failed))) == before  # nothing changed

    assert ok(cli("dlq", "resubmit", failed, "--json")).json() == {
        "dry_run": False, "matched": 1, "resubmitted": [failed], "skipped": []}
    assert wait_state(j, failed, S.FAILED).attempt == 2
    again = ok(cli("dlq", "resubmit", f"{failed}:1"))
    assert "resubmitted" in again.out
    assert "Resubmitted 1 of 1." in again.out
    wait_state(j, failed, S.FAILED)
    wait_for(lambda: len(j.sink.of_task(failed)) == 3, message="the third entry")
    # by filter, a task is resubmitted once: from its newest entry
    would = ok(cli("dlq", "resubmit", "--task", "proj.boom", "--dry-run", "--json")).json()
    assert [e["id"] for e in would["entries"] if e["task_id"] == failed] == [
        f"{failed}:3"]
    declined = ok(cli("dlq", "discard", failed, stdin="n\n"))
    assert "Nothing discarded." in declined.out
    assert "[y/N]" in declined.err
    assert len(cli("dlq", "list", "--task", "proj.boom", "--json").json()) >= 1
    gone = ok(cli("dlq", "discard", failed, "--yes", "--json")).json()
    assert gone["discarded"] == 3
    assert cli("dlq", "show", failed).rc == 3


# ---------------------------------------------------------------------- hostile ids
#: Ids a publisher may choose; each command finds its task and prints it escaped.
#: (a few: each command is a process; tests/django/test_hostile_ids.py has more.)
HOSTILE_IDS = ["line\nbreak", "a/b", "..", " two words ", "\x1b]0;pwned\x07\x1b[2J",
               "ok\rforged", "\u202eevil", "x" * 1000]
#: A task name no worker registers (the worker drops it): it holds terminal escapes too.
HOSTILE_NAME = "proj.\x1b]0;pwned\x07unknown\r\x1b[2J"


def _terminal_safe(text: str) -> bool:
    return all(c == "\n" or c.isprintable() for c in text)


def test_show_finds_any_id_and_every_command_prints_it_escaped(world: World) -> None:
    proj, j = world.proj, world.proj.jobbers
    salt = uuid.uuid4().hex[:6]
    ids = [f"{salt}{task_id}" for task_id in HOSTILE_IDS]
    for task_id in ids:
        proj.boom.apply_async(task_id=task_id)
    named = f"{salt}-named\nid"
    proj.app.send_task(HOSTILE_NAME, task_id=named)
    for task_id in ids:
        wait_state(j, task_id, S.FAILED, worker=world.worker)
    wait_state(j, named, S.DROPPED, S.FAILED, worker=world.worker)
    runs = many(*[("show", t) for t in [*ids, named]],
                ("show", named, "--json"), ("tasks", "--limit", "100"),
                ("dlq", "list", "--task", "proj.boom", "--limit", "100"),
                ("dlq", "show", ids[0]), ("dlq", "show", ids[-1]))  # 1,000: stored cut
    for run in runs:
        ok(run)
        assert _terminal_safe(run.out + run.err), (run.args, run.out)
    shows = runs[:len(ids) + 1]
    for task_id, run in zip([*ids, named], shows, strict=True):
        first = run.out.splitlines()[0]
        assert first.split(None, 1)[1] == printable(task_id), first  # found: its own id
    assert "proj.\\x1b]0;pwned\\x07unknown\\r\\x1b[2J" in shows[-1].out
    assert runs[len(ids) + 1].json()["record"]["name"] == HOSTILE_NAME
    table = runs[len(ids) + 2].out
    assert printable(named) in table
    assert not any(line.startswith("forged") for line in table.splitlines())
