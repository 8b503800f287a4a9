"""A chord whose header member failed into the dead-letter queue is repaired by resubmitting
the member (``jobbers_celery.lifecycle.chords``); plain Celery fails such a chord for good.

Real ``celery worker`` subprocesses, Celery's Redis result backend (its native chord
counter). What the result backend shows is asserted at each step, for the docs' table.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, chord
from celery.exceptions import ChordError, TimeoutError
from celery.result import result_from_tuple

from jobbers_celery import get_jobbers
from jobbers_celery.core.states import TaskState
from tests.conftest import ROOT, Worker, start_worker, subprocess_env, wait_for
from tests.integration.lifecycle_helpers import dead_letters, wait_state


@pytest.fixture
def tracked(redis_url: str) -> Any:
    import importlib

    return importlib.import_module("tests.integration.chord_proj").app


@pytest.fixture
def plain(redis_url: str) -> Any:
    import importlib

    return importlib.import_module("tests.integration.chord_plain_proj").app


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[[Any, str], Worker]]:
    started: list[Worker] = []

    def start(app: Any, module: str) -> Worker:
        worker = start_worker(app, module, tmp_path, concurrency=2)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def _entries(jobbers: Any, task_id: str) -> list[Any]:
    """The task's dead letters, once there (written just after its failed step)."""
    wait_for(lambda: dead_letters(jobbers, task_id), message=f"a dead letter of {task_id}")
    return dead_letters(jobbers, task_id)


def _chord_keys(app: Any, group_id: str) -> Callable[[], dict[str, Any]]:
    """Celery's Redis chord counter of ``group_id``: the members whose part returned (the
    ``.j`` sorted set), the chord size (``.s``) and the callback's claim (``.c``)."""
    backend = app.backend

    def read() -> dict[str, Any]:
        client = backend.client
        parts = client.zrange(backend.get_key_for_group(group_id, ".j"), 0, -1)
        size = client.get(backend.get_key_for_group(group_id, ".s"))
        claim = client.get(backend.get_key_for_group(group_id, ".c"))
        return {"returned": [backend.decode(p)[1] for p in parts],
                "size": size.decode() if size else None,
                "claim": claim.decode() if claim else None}

    return read


def _fix(redis_url: str, key: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(key, "fixed")
    client.close()


def _chord(app: Any, key: str) -> tuple[Any, list[str]]:
    """A chord of three members (the second fails until ``key`` is fixed) and a callback
    collecting their results; returns its result and the members' ids."""
    name = app.main
    member, collect = app.tasks[f"{name}.member"], app.tasks[f"{name}.collect"]
    header = [member.s(0), member.s(1, key), member.s(2)]
    ids = [str(uuid.uuid4()) for _ in header]
    for sig, task_id in zip(header, ids, strict=True):
        sig.set(task_id=task_id)
    return chord(header)(collect.s()), ids


def test_dead_lettered_member_holds_the_chord_and_its_resubmit_runs_the_callback(
        tracked: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    workers(tracked, "tests.integration.chord_proj")
    jobbers = get_jobbers(tracked)
    key = f"flag-{uuid.uuid4().hex}"
    result, ids = _chord(tracked, key)
    failed = ids[1]
    saved = result.as_tuple()  # what an app keeps to find the chord's result later

    # the member failed into the DLQ: its FAILURE is stored, as in Celery ...
    wait_state(jobbers, failed, TaskState.FAILED)
    wait_for(lambda: tracked.AsyncResult(failed).state == "FAILURE")
    assert [e.task_id for e in _entries(jobbers, failed)] == [failed]
    for other in (ids[0], ids[2]):
        wait_for(lambda other=other: tracked.AsyncResult(other).state == "SUCCESS")
    with pytest.raises(ValueError, match="is not fixed"):
        tracked.AsyncResult(failed).get(timeout=5, propagate=True)
    # ... but its chord part is held: the callback waits, PENDING, never ChordError
    assert result.state == "PENDING"
    # Celery's chord counter: two parts of three returned (the held one is not there)
    counter = _chord_keys(tracked, result.parent.id)
    assert counter() == {"returned": [ids[0], ids[2]], "size": "3", "claim": None}
    with pytest.raises(TimeoutError):
        result.get(timeout=1.5, follow_parents=False)
    assert result.state == "PENDING"
    # a caller following the header (get()'s default) meets the member's error, as in Celery
    with pytest.raises(ValueError, match="is not fixed"):
        result.get(timeout=5)

    # the condition fixed, the member is resubmitted: its success counts its part
    _fix(redis_url, key)
    assert jobbers.resubmit([failed]) == [failed]
    # the backend still shows the member's FAILURE until its new run ends (a caller
    # following the header raises it meanwhile), then its SUCCESS
    wait_for(lambda: tracked.AsyncResult(failed).state == "SUCCESS", timeout=20)
    # the chord's result, as a caller finds it again (another process: its own backend;
    # this process's backend keeps the member's FAILURE it already received)
    other = Celery("caller", broker=redis_url, backend=redis_url, set_as_current=False)
    try:
        assert result_from_tuple(saved, other).get(timeout=20) == [0, 10, 20]
    finally:
        other.close()
    assert tracked.AsyncResult(result.id).get(timeout=5) == [0, 10, 20]
    # a result object that already met the member's FAILURE keeps it (Celery caches a
    # ready result): its own callback result is read past the header
    assert result.get(timeout=5, follow_parents=False) == [0, 10, 20]
    assert tracked.AsyncResult(failed).state == "SUCCESS"
    assert tracked.AsyncResult(failed).result == 10
    # the counter reached three, the callback was sent, Celery cleaned the chord up
    wait_for(lambda: counter() == {"returned": [], "size": None, "claim": "done"})
    wait_state(jobbers, failed, TaskState.COMPLETED)
    wait_state(jobbers, result.id, TaskState.COMPLETED)


def test_plain_celery_fails_the_chord_for_good(
        plain: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    """What plain Celery does in the same scenario (the docs' table): the callback fails
    with ChordError once every part returned, and a later run of the member changes
    nothing (Celery counts a task's part once)."""
    workers(plain, "tests.integration.chord_plain_proj")
    key = f"flag-{uuid.uuid4().hex}"
    result, ids = _chord(plain, key)
    with pytest.raises(ChordError, match=r"Dependency .* raised"):
        result.get(timeout=20, follow_parents=False)
    with pytest.raises(ValueError, match="is not fixed"):  # the header's error first
        result.get(timeout=5)
    assert plain.AsyncResult(ids[1]).state == "FAILURE"
    assert result.state == "FAILURE"
    # Celery counted the failed part, failed the callback and dropped the chord's size
    counted = _chord_keys(plain, result.parent.id)
    wait_for(lambda: counted()["size"] is None)  # dropped just after the callback's FAILURE
    assert sorted(counted()["returned"]) == sorted(ids)
    # run the member again, fixed, under its own id (what a resubmit would publish)
    _fix(redis_url, key)
    member = plain.tasks["chordp.member"]
    member.apply_async((1, key), task_id=ids[1])
    wait_for(lambda: plain.AsyncResult(ids[1]).state == "SUCCESS", timeout=20)
    assert plain.AsyncResult(ids[1]).result == 10
    assert result.state == "FAILURE"  # the chord stays failed


def _discard_cli(task_id: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.integration.chord_proj jobbers dlq discard ID --yes``."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.chord_proj", "jobbers",
         "dlq", "discard", task_id, "--yes"],
        cwd=ROOT, env=subprocess_env({"NO_COLOR": "1"}), capture_output=True, text=True,
        timeout=60, check=False)


def test_discarding_the_held_member_fails_the_chord_as_celery_does(
        tracked: Any, workers: Callable[[Any, str], Worker]) -> None:
    """The operator gives up on the member: ``jobbers dlq discard`` releases its part,
    counted failed, and the callback fails with Celery's ChordError for that member."""
    workers(tracked, "tests.integration.chord_proj")
    jobbers = get_jobbers(tracked)
    result, ids = _chord(tracked, f"flag-{uuid.uuid4().hex}")
    failed = ids[1]
    wait_state(jobbers, failed, TaskState.FAILED)
    wait_for(lambda: tracked.AsyncResult(ids[2]).state == "SUCCESS")
    assert result.state == "PENDING"

    assert [e.task_id for e in _entries(jobbers, failed)] == [failed]
    done = _discard_cli(failed)
    assert done.returncode == 0, done.stderr
    assert "Discarded 1 entry" in done.stdout
    with pytest.raises(ChordError, match=rf"Dependency {failed} raised ValueError"):
        result.get(timeout=20, follow_parents=False)
    assert result.state == "FAILURE"
    # the released part counted, as Celery counts a failed one (then it drops the size)
    counted = _chord_keys(tracked, result.parent.id)
    wait_for(lambda: counted()["size"] is None)  # dropped just after the callback's FAILURE
    assert sorted(counted()["returned"]) == sorted(ids)
    assert dead_letters(jobbers, failed) == []
    # again: nothing more happens (Celery's backend counts a part once)
    assert jobbers.release_chord_parts([]) == []


def test_release_skips_a_member_resubmitted_since(
        tracked: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    """An older dead letter discarded after its task was resubmitted (and succeeded)
    releases nothing: the new run counted the part."""
    workers(tracked, "tests.integration.chord_proj")
    jobbers = get_jobbers(tracked)
    key = f"flag-{uuid.uuid4().hex}"
    result, ids = _chord(tracked, key)
    failed = ids[1]
    wait_state(jobbers, failed, TaskState.FAILED)
    (entry,) = _entries(jobbers, failed)
    assert entry.options["chord"]["task"] == "chordj.collect"  # the callback, to count on
    assert entry.options["group_id"] == result.parent.id
    assert entry.options.get("group_index") == 1
    _fix(redis_url, key)
    assert jobbers.resubmit_dead_letters([entry]) == [failed]
    wait_state(jobbers, failed, TaskState.COMPLETED)
    assert jobbers.release_chord_parts([entry]) == []
    wait_for(lambda: tracked.AsyncResult(result.id).state == "SUCCESS", timeout=20)
    assert tracked.AsyncResult(result.id).result == [0, 10, 20]


def test_a_stalled_member_holds_its_part_and_its_resubmit_runs_the_callback(
        tracked: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    """A member whose worker died never returned its part: it is held already; stalled
    into the DLQ, its resubmit completes the chord the same way."""
    worker = workers(tracked, "tests.integration.chord_proj")
    jobbers = get_jobbers(tracked)
    key = f"flag-{uuid.uuid4().hex}"
    name = tracked.main
    member, hang, collect = (tracked.tasks[f"{name}.{t}"] for t in ("member", "hang", "collect"))
    stuck, ids = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(2)]
    result = chord([member.s(0).set(task_id=ids[0]), hang.s(1, key).set(task_id=stuck),
                    member.s(2).set(task_id=ids[1])])(collect.s())
    wait_state(jobbers, stuck, TaskState.STARTED)
    for done in ids:
        wait_state(jobbers, done, TaskState.COMPLETED)
    os.killpg(worker.proc.pid, signal.SIGKILL)  # the whole worker: nothing reports anything
    worker.proc.wait(10)
    workers(tracked, "tests.integration.chord_proj")  # its cleaner finds the silent task
    wait_state(jobbers, stuck, TaskState.STALLED, timeout=30)
    assert [e.task_id for e in _entries(jobbers, stuck)] == [stuck]
    assert tracked.AsyncResult(stuck).state == "PENDING"  # it never returned anything
    assert result.state == "PENDING"

    _fix(redis_url, key)
    assert jobbers.resubmit([stuck]) == [stuck]
    wait_for(lambda: tracked.AsyncResult(result.id).state == "SUCCESS", timeout=30)
    assert tracked.AsyncResult(result.id).result == [0, 10, 20]


def test_a_member_whose_pool_process_was_lost_holds_its_part(
        tracked: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    """A lost pool process (WorkerLostError, reported by the worker's main process) of a
    member saving dead letters: failed into the DLQ, its part held, its resubmit runs the
    callback."""
    workers(tracked, "tests.integration.chord_proj")
    jobbers = get_jobbers(tracked)
    key = f"flag-{uuid.uuid4().hex}"
    name = tracked.main
    member, lost, collect = (tracked.tasks[f"{name}.{t}"] for t in ("member", "lost", "collect"))
    dies = str(uuid.uuid4())
    result = chord([member.s(0), lost.s(1, key).set(task_id=dies), member.s(2)])(collect.s())
    wait_state(jobbers, dies, TaskState.FAILED)
    wait_for(lambda: tracked.AsyncResult(dies).state == "FAILURE")
    assert "WorkerLostError" in repr(tracked.AsyncResult(dies).result)
    assert [e.task_id for e in _entries(jobbers, dies)] == [dies]
    with pytest.raises(TimeoutError):
        result.get(timeout=1.5, follow_parents=False)
    _fix(redis_url, key)
    assert jobbers.resubmit([dies]) == [dies]
    wait_for(lambda: tracked.AsyncResult(result.id).state == "SUCCESS", timeout=20)
    assert tracked.AsyncResult(result.id).result == [0, 10, 20]


# ---------------------------------------------------------------------- polling backends
# A result backend without a native chord counter (here the filesystem backend): the chord's
# publisher sends celery.chord_unlock, which polls the header's states.

@pytest.fixture
def tracked_file(redis_url: str) -> Any:
    import importlib

    return importlib.import_module("tests.integration.chord_file_proj").app


@pytest.fixture
def plain_file(redis_url: str) -> Any:
    import importlib

    return importlib.import_module("tests.integration.chord_file_plain_proj").app


def test_polling_backend_plain_celery_fails_the_chord(
        plain_file: Any, workers: Callable[[Any, str], Worker]) -> None:
    workers(plain_file, "tests.integration.chord_file_plain_proj")
    result, ids = _chord(plain_file, f"flag-{uuid.uuid4().hex}")
    with pytest.raises(ChordError, match="is not fixed"):
        result.get(timeout=20, follow_parents=False)
    assert plain_file.AsyncResult(ids[1]).state == "FAILURE"


def test_polling_backend_held_member_resubmitted_runs_the_callback(
        tracked_file: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    worker = workers(tracked_file, "tests.integration.chord_file_proj")
    jobbers = get_jobbers(tracked_file)
    key = f"flag-{uuid.uuid4().hex}"
    result, ids = _chord(tracked_file, key)
    failed = ids[1]
    wait_state(jobbers, failed, TaskState.FAILED)
    wait_for(lambda: tracked_file.AsyncResult(failed).state == "FAILURE")
    wait_for(lambda: worker.log.count("celery.chord_unlock") >= 4)  # it polls on
    assert tracked_file.AsyncResult(result.id).state == "PENDING"

    _fix(redis_url, key)
    assert jobbers.resubmit([failed]) == [failed]
    wait_for(lambda: tracked_file.AsyncResult(result.id).state == "SUCCESS", timeout=20)
    assert tracked_file.AsyncResult(result.id).result == [0, 10, 20]
    assert tracked_file.AsyncResult(failed).result == 10


def test_polling_backend_discard_fails_the_chord_and_ends_the_poll(
        tracked_file: Any, workers: Callable[[Any, str], Worker]) -> None:
    worker = workers(tracked_file, "tests.integration.chord_file_proj")
    jobbers = get_jobbers(tracked_file)
    result, ids = _chord(tracked_file, f"flag-{uuid.uuid4().hex}")
    failed = ids[1]
    wait_state(jobbers, failed, TaskState.FAILED)
    wait_for(lambda: worker.log.count("celery.chord_unlock") >= 4)
    assert tracked_file.AsyncResult(result.id).state == "PENDING"

    entries = _entries(jobbers, failed)
    assert jobbers.sink.discard(entries) == 1
    assert jobbers.release_chord_parts(entries) == [failed]
    callback = tracked_file.AsyncResult(result.id)
    assert callback.state == "FAILURE"
    assert isinstance(callback.result, ChordError)
    assert f"Dependency {failed} raised ValueError" in str(callback.result)
    # the poll ends: its next run returns (a poll that goes on is logged as a retry)
    wait_for(lambda: re.search(r"celery\.chord_unlock\[[^]]+\] succeeded", worker.log),
             timeout=10)


def test_a_workflows_failed_members_resubmitted_at_once_run_the_callback(
        tracked: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    """Two members failed into the DLQ: ``Jobbers.resubmit_workflow`` sends both back, and
    the callback runs when both complete."""
    workers(tracked, "tests.integration.chord_proj")
    jobbers = get_jobbers(tracked)
    key = f"flag-{uuid.uuid4().hex}"
    member, collect = tracked.tasks["chordj.member"], tracked.tasks["chordj.collect"]
    ids = [str(uuid.uuid4()) for _ in range(3)]
    header = [member.s(0, key), member.s(1), member.s(2, key)]
    for sig, task_id in zip(header, ids, strict=True):
        sig.set(task_id=task_id)
    result = chord(header)(collect.s())
    for failed in (ids[0], ids[2]):
        wait_state(jobbers, failed, TaskState.FAILED)
    wait_state(jobbers, ids[1], TaskState.COMPLETED)
    assert tracked.AsyncResult(result.id).state == "PENDING"
    _fix(redis_url, key)
    assert sorted(jobbers.resubmit_workflow(ids[1])) == sorted([ids[0], ids[2]])
    wait_for(lambda: tracked.AsyncResult(result.id).state == "SUCCESS", timeout=20)
    assert tracked.AsyncResult(result.id).result == [0, 10, 20]


def test_a_member_rejected_without_requeue_holds_its_part(
        tracked: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    """``Reject(requeue=False)`` (Celery marks it failed in the worker's main process):
    failed into the DLQ, its part held, its resubmit runs the callback."""
    workers(tracked, "tests.integration.chord_proj")
    jobbers = get_jobbers(tracked)
    key = f"flag-{uuid.uuid4().hex}"
    member, refuse, collect = (tracked.tasks[f"chordj.{t}"]
                               for t in ("member", "refuse", "collect"))
    refused = str(uuid.uuid4())
    result = chord([member.s(0), refuse.s(1, key).set(task_id=refused), member.s(2)])(
        collect.s())
    wait_state(jobbers, refused, TaskState.FAILED)
    wait_for(lambda: tracked.AsyncResult(refused).state == "FAILURE")
    assert [e.task_id for e in _entries(jobbers, refused)] == [refused]
    with pytest.raises(TimeoutError):
        result.get(timeout=1.5, follow_parents=False)
    _fix(redis_url, key)
    assert jobbers.resubmit([refused]) == [refused]
    wait_for(lambda: tracked.AsyncResult(result.id).state == "SUCCESS", timeout=20)
    assert tracked.AsyncResult(result.id).result == [0, 10, 20]


def test_a_member_past_its_hard_time_limit_holds_its_part(
        tracked: Any, workers: Callable[[Any, str], Worker], redis_url: str) -> None:
    """A hard time limit (the worker's main process marks it failed, TimeLimitExceeded):
    failed into the DLQ, its part held, its resubmit runs the callback."""
    workers(tracked, "tests.integration.chord_proj")
    jobbers = get_jobbers(tracked)
    key = f"flag-{uuid.uuid4().hex}"
    member, slow, collect = (tracked.tasks[f"chordj.{t}"] for t in ("member", "slow", "collect"))
    killed = str(uuid.uuid4())
    result = chord([member.s(0), slow.s(1, key).set(task_id=killed), member.s(2)])(
        collect.s())
    wait_state(jobbers, killed, TaskState.FAILED)
    wait_for(lambda: tracked.AsyncResult(killed).state == "FAILURE")
    assert "TimeLimitExceeded" in repr(tracked.AsyncResult(killed).result)
    assert [e.task_id for e in _entries(jobbers, killed)] == [killed]
    with pytest.raises(TimeoutError):
        result.get(timeout=1.5, follow_parents=False)
    _fix(redis_url, key)
    assert jobbers.resubmit([killed]) == [killed]
    wait_for(lambda: tracked.AsyncResult(result.id).state == "SUCCESS", timeout=20)
    assert tracked.AsyncResult(result.id).result == [0, 10, 20]
