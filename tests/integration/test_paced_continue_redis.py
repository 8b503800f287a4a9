"""A halted paced resubmit of the Redis sink can be continued: ``run_control.lua`` on a
real Redis (and the in-memory kit alike) moves it back to running, empties its stop rule's
window (the failures that halted it are not counted again), keeps it (its keys no longer
expire) and puts it back among the runs the scheduler passes drive; ``celery jobbers dlq
run ID --continue`` does it, and refuses (exit 2) a run that is not halted."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import redis
from click.testing import CliRunner

from jobbers_celery.cli import jobbers
from jobbers_celery.resubmit.pace import RunStatus
from jobbers_celery.store import RedisStore
from jobbers_celery.store.runs import run_keys
from jobbers_celery.testing.runs import MemoryRuns
from tests.conftest import wait_for

REASON = ("2 of the last 2 resubmitted tasks failed again (the rule: halt when more than 1 "
          "of the last 4)")


def _halted(store: RedisStore | MemoryRuns) -> int:
    """A run that claimed 2 of 3 entries, both failed again, and the rule halted it."""
    run_id = store.create_run({"status": "queued", "rate": "500", "claimed": "0",
                               "halt_after": "1", "of_last": "4"}, ["a:1", "b:1", "c:1"],
                              "{}")
    claimed = store.claim_run(run_id, 1)  # one at once, then 500 per second
    wait_for(lambda: claimed.extend(store.claim_run(run_id, 1)) or len(claimed) == 2,
             message="the pace to allow a second entry")
    status, changed = store.settle_run(run_id, [(m, "f", "") for m in claimed], 1000)
    assert (status, changed) == ("halted", REASON)
    return run_id


def test_lua_continue_starts_the_rule_over_and_drives_the_run_again(
        make_store: Callable[..., RedisStore], r: redis.Redis) -> None:
    store = make_store(f"cont{time.monotonic_ns()}")
    run_id = _halted(store)
    keys = run_keys(store, run_id)
    assert r.ttl(keys[0]) > 0  # a finished run expires after the retention period
    assert str(run_id) not in r.smembers(keys[7])
    assert store.control_run(run_id, "resume", "ops") == (False, "halted")  # resume: paused

    assert store.control_run(run_id, "continue", "ops") == (True, "running")
    fields, pending, unsettled, events, _ = store.run(run_id) or ({}, 0, 0, [], {})
    assert fields["status"] == "running"
    assert fields["halt_reason"] == ""
    assert "finished_at" not in fields
    assert (pending, unsettled) == (1, 0)
    assert r.llen(keys[4]) == 0  # the window: the two failures are not counted again
    assert r.ttl(keys[0]) == -1  # kept as any moving run
    assert str(run_id) in r.smembers(keys[7])
    assert json.loads(events[-1])["action"] == "continue"
    assert json.loads(events[-1])["detail"] == f"after: {REASON}"
    # the last entry goes out, completes: the run is done, not halted again
    assert store.claim_run(run_id, 5) == ["c:1"]
    assert store.settle_run(run_id, [("c:1", "c", "")], 1000) == (
        "done", "every entry published and settled")
    assert store.control_run(run_id, "continue", "ops") == (False, "done")


def test_the_memory_kit_continues_alike() -> None:
    store = MemoryRuns()
    run_id = _halted(store)
    assert run_id not in store.active_runs(10)
    assert store.control_run(run_id, "continue", "ops") == (True, "running")
    assert run_id in store.active_runs(10)
    assert store.claim_run(run_id, 5) == ["c:1"]
    # failed again: 1 of the last 1 since the continue, not more than 1: done, not halted
    assert store.settle_run(run_id, [("c:1", "f", "")], 1000) == (
        "done", "every entry published and settled")


def test_the_cli_continues_a_halted_run(proj: Any) -> None:
    run_id = _halted(proj.jobbers.store)

    def cli(*args: str) -> Any:
        return CliRunner().invoke(jobbers, list(args), obj=SimpleNamespace(app=proj.app))

    shown = cli("dlq", "run", str(run_id))
    assert f"halted: {REASON}" in shown.output
    moved = cli("dlq", "run", str(run_id), "--continue", "--json")
    assert moved.exit_code == 0, moved.output
    assert json.loads(moved.output)["status"] == RunStatus.RUNNING.value
    again = cli("dlq", "run", str(run_id), "--continue")
    assert again.exit_code == 2
    assert f"paced resubmit {run_id} is running: it can be continued only when halted" in \
        " ".join(again.output.split())
