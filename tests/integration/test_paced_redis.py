"""Paced resubmits from the Redis dead-letter sink, driven by a real worker's scheduler
passes (prefork, Redis broker), started and controlled through ``celery jobbers dlq`` in
real subprocesses and through the ``Jobbers`` API.

``proj.until_fixed`` fails (and is dead-lettered) until its Redis key is set: a run over 20
of them while the cause is not fixed halts by its stop rule with most entries unpublished;
once fixed, a run over the same entries ends done with exact counts.
"""

from __future__ import annotations

import importlib
import re
import uuid
from collections.abc import Iterator

import pytest
import redis

from jobbers_celery import ResubmitRunInfo, RunStatus, TaskState
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.deadletter.redis_sink import RedisDeadLetterSink
from tests.conftest import RedisServer, start_worker, wait_for
from tests.integration.test_cli import World, cli, ok

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState


@pytest.fixture(scope="module")
def world(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    """One worker for the module (its scheduler passes drive the runs)."""
    client = redis.Redis.from_url(redis_server.url())
    client.flushdb()
    proj = importlib.import_module("tests.integration.proj")
    world = World(proj, start_worker(proj.app, "tests.integration.proj",
                                     tmp_path_factory.mktemp("pace")))
    yield world
    world.worker.kill()  # the one running now (a test restarts it)
    client.flushdb()
    client.close()


def _dead(world: World, task: str, args: tuple[object, ...], n: int) -> list[DeadLetter]:
    """``n`` tasks of ``task`` failed and dead-lettered; their entries."""
    proj, j = world.proj, world.proj.jobbers
    ids = [f"{task.rpartition('.')[2]}-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    for task_id in ids:
        proj.app.tasks[task].apply_async(args, task_id=task_id)
    sink = j.sink
    assert isinstance(sink, RedisDeadLetterSink)

    def entries() -> list[DeadLetter] | None:
        records = [j.get(t) for t in ids]
        if not all(r is not None and r.state == S.FAILED for r in records):
            return None
        found = [sink.entry(r.task_id, r.attempt) for r in records if r is not None]
        return [e for e in found if e is not None] if all(found) else None

    return wait_for(entries, timeout=60, interval=0.1, message=f"{n} dead {task} tasks")


def _settled(world: World, run_id: int, statuses: set[RunStatus]) -> ResubmitRunInfo:
    """The run once in one of ``statuses`` with nothing left in flight."""
    j = world.proj.jobbers

    def ended() -> ResubmitRunInfo | None:
        info = j.resubmit_run(run_id)
        return info if info and info.status in statuses and info.in_flight == 0 else None

    return wait_for(ended, timeout=60, interval=0.1, message=f"run {run_id} in {statuses}")


def test_unfixed_cause_halts_then_fixed_cause_is_done(world: World, capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    proj, j = world.proj, world.proj.jobbers
    key = f"proj:fixed:{uuid.uuid4().hex[:8]}"
    entries = _dead(world, "proj.until_fixed", (key,), 20)

    # the cause is not fixed: halt when more than 2 of the last 5 failed again
    run = j.start_resubmit_run(entries, rate=5, halt_after=2, of_last=5)
    assert (run.status, run.total, run.remaining) == (RunStatus.QUEUED, 20, 20)
    halted = _settled(world, run.id, {RunStatus.HALTED, RunStatus.DONE})
    with capsys.disabled():
        print(f"\nhalted run #{halted.id}: {halted.rate:g}/s, {halted.rule}; published "
              f"{halted.published} of {halted.total} before the halt (failed again "
              f"{halted.failed_again}, completed {halted.completed}, remaining "
              f"{halted.remaining}); {halted.halt_reason}")
    assert halted.status == RunStatus.HALTED
    failed, window = map(int, re.match(r"(\d+) of the last (\d+) ", halted.halt_reason
                                        ).groups())  # type: ignore[union-attr]
    assert 2 < failed <= window <= 5
    assert halted.halt_reason.endswith("failed again (the rule: halt when more than 2 of the "
                                       "last 5)")
    assert halted.failed_again == halted.published >= 3
    assert halted.completed == halted.skipped == halted.publish_failed == 0
    assert halted.remaining == 20 - halted.published > 0
    assert [e["action"] for e in halted.events] == ["start", "halted"]
    # the unpublished entries stay dead, at the attempt they were selected at
    left = {f"{e.task_id}:{e.attempt}" for e in entries}
    for entry in entries:
        record = j.get(entry.task_id)
        assert record is not None
        assert record.state == S.FAILED
        if record.attempt == entry.attempt:
            left.discard(f"{entry.task_id}:{entry.attempt}")
    assert len(left) == halted.published  # exactly the published ones ran again

    # fixed: the same 20 tasks (their newest entries), through the command line
    proj._redis().set(key, "1")
    started = ok(cli("dlq", "resubmit", "--task", "proj.until_fixed", "--rate", "50",
                     "--halt-after", "2", "--of-last", "5", "--json")).json()
    assert (started["status"], started["total"], started["rule"]) == (
        "queued", 20, "halt when more than 2 of the last 5 failed again")
    assert started["filters"] == {"task": "proj.until_fixed"}
    assert started["left_out"] == []
    done = _settled(world, started["id"], {RunStatus.HALTED, RunStatus.DONE})
    assert (done.status, done.total, done.published, done.completed, done.failed_again,
            done.skipped, done.publish_failed, done.remaining) == (
        RunStatus.DONE, 20, 20, 20, 0, 0, 0, 0)
    assert all(r is not None and r.state == S.COMPLETED for r in
               (j.get(e.task_id) for e in entries))
    shown = ok(cli("dlq", "run", str(done.id))).out.splitlines()
    assert shown[0] == (f"Paced resubmit #{done.id}: done, 50/s, halt when more than 2 of "
                        "the last 5 failed again")
    assert shown[1].split() == ["SELECTED", "PUBLISHED", "COMPLETED", "FAILED", "AGAIN",
                                "SKIPPED", "REMAINING"]
    assert shown[2].split() == ["20", "20", "20", "0", "0", "0"]


def test_pause_resume_cancel_through_the_command_line(world: World) -> None:
    j = world.proj.jobbers
    entries = _dead(world, "proj.boom", (), 3)
    ids = [f"{e.task_id}:{e.attempt}" for e in entries]
    # one at once, then one every 10 s (the slowest pace): each step below takes one command,
    # long before a second is due
    started = cli("dlq", "resubmit", *ids, "--rate", "0.1")
    assert ok(started).out.startswith("Started paced resubmit #")
    run_id = int(started.out.split("#", 1)[1].split(":", 1)[0])
    assert f"celery -A tests.integration.proj jobbers dlq run {run_id}" in started.out

    paused = ok(cli("dlq", "run", str(run_id), "--pause", "--json")).json()
    assert paused["status"] == "paused"
    assert paused["task_ids"] == ids
    again = cli("dlq", "run", str(run_id), "--pause")
    assert again.rc == 2
    assert "is paused: it can be paused only when queued or running" in again.err
    assert ok(cli("dlq", "run", str(run_id), "--resume", "--json")).json()["status"] == "running"
    cancelled = ok(cli("dlq", "run", str(run_id), "--cancel", "--json")).json()
    assert cancelled["status"] == "cancelled"
    assert [e["action"] for e in cancelled["events"]] == ["start", "pause", "resume", "cancel"]
    assert all(e["by"].startswith("cli:") for e in cancelled["events"][1:])
    assert cli("dlq", "run", str(run_id), "--resume").rc == 2
    assert cli("dlq", "run", "999999").rc == 3

    info = _settled(world, run_id, {RunStatus.CANCELLED})
    # at most one published at once and one at the resume; the rest stays dead
    assert 1 <= info.published <= 2
    assert info.remaining == 3 - info.published
    assert info.failed_again == info.published  # proj.boom always fails
    unpublished = [e for e in entries if e.task_id not in
                   {e2.task_id for e2 in entries[:info.published]}]
    for entry in unpublished:
        record = j.get(entry.task_id)
        assert record is not None
        assert (record.state, record.attempt) == (S.FAILED,
                                                                         entry.attempt)


def test_a_run_goes_on_across_a_worker_restart(world: World,
                                               tmp_path_factory: pytest.TempPathFactory,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The run's state is in Redis and any worker's scheduler passes drive it: paused, its
    worker stopped, resumed while no worker runs, it ends done under a new worker."""
    proj, j = world.proj, world.proj.jobbers
    key = f"proj:fixed:{uuid.uuid4().hex[:8]}"
    entries = _dead(world, "proj.until_fixed", (key,), 6)
    proj._redis().set(key, "1")
    run = j.start_resubmit_run(entries, rate=2, halt_after=0, of_last=6)
    wait_for(lambda: j.resubmit_run(run.id).published >= 1,  # type: ignore[union-attr]
             timeout=30, message="a first publish")
    j.pause_resubmit_run(run.id, by="test")
    # what was published before the pause runs to its end before the worker stops (a warm
    # shutdown ends a running task stalled by its on_shutdown=stop policy: a re-failure
    # that halts this halt_after=0 run, which is not what this test is about)
    wait_for(lambda: all(r is not None and r.state in (S.COMPLETED, S.FAILED)
                         for r in (j.get(e.task_id) for e in entries)),
             timeout=30, message="the tasks published before the pause to finish")
    world.worker.stop()
    at_stop = j.resubmit_run(run.id)
    assert at_stop is not None
    assert at_stop.status == RunStatus.PAUSED
    j.resume_resubmit_run(run.id, by="test")
    world.worker = start_worker(proj.app, "tests.integration.proj",
                                tmp_path_factory.mktemp("pace-restart"))
    done = _settled(world, run.id, {RunStatus.HALTED, RunStatus.DONE})
    with capsys.disabled():
        print(f"\nrestart: {at_stop.published} published before the worker stopped, "
              f"{done.published} in all; {done.status}")
    assert (done.status, done.published, done.completed, done.failed_again,
            done.remaining) == (RunStatus.DONE, 6, 6, 0, 0)
    assert [e["action"] for e in done.events] == ["start", "pause", "resume", "done"]
