"""The record and Celery's result agree on how a task ended, in every result layout, kills
included.

Three layouts: results on the jobbers Redis server (the write folded into the ``completed``
step), on another Redis server, and in another kind of backend (Celery's filesystem
backend). In each, the same task runs as a plain ``celery.Task`` and as a ``JobbersTask``
(``tests.integration.ending_proj``):

- a result the result serializer cannot encode: the caller gets FAILURE (``EncodeError``) from
  both; the record says ``failed`` with the encode error;
- the pool process SIGKILLed right after jobbers' ``completed`` step, or right after Celery's
  result write (fault injection in the worker): Celery's result and the record agree
  (SUCCESS and ``completed``), within a window measured from the kill.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu.exceptions import EncodeError

from jobbers_celery import TaskState
from tests.conftest import RedisServer, Worker, wait_for
from tests.integration.ending_helpers import Setup, setups
from tests.integration.lifecycle_helpers import dead_letters, transitions

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
LAYOUTS = ["same redis", "other redis", "filesystem"]
#: How long the record and Celery's result may disagree after a kill: until the worker's
#: main process sees its pool process's death (at once, or at billiard's pool maintenance,
#: every 5 s: plain Celery's handling of the loss waits as long), reads the result and
#: records the completion. Asserted, and printed with what each run measured.
WINDOW_S = 7.0
#: Celery's state for each final record state.
AGREES = {S.COMPLETED: "SUCCESS", S.FAILED: "FAILURE"}


@pytest.fixture(scope="module")
def other_server() -> Iterator[str]:
    server = RedisServer()
    yield server.url(0)
    server.stop()


@pytest.fixture
def setup_for(redis_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    with setups(redis_url, tmp_path, lambda: request.getfixturevalue("other_server")) as make:
        yield make


def agreement(setup: Setup, task_id: str) -> tuple[str, TaskState | None]:
    record = setup.jobbers.get(task_id)
    return setup.app.AsyncResult(task_id).state, record.state if record else None


def wait_agreed(setup: Setup, task_id: str, worker: Worker) -> tuple[str, TaskState, float]:
    """Poll until Celery's state and the record's are final and agree; returns both and
    when they first did (time.time())."""
    def agreed() -> tuple[str, TaskState, float] | None:
        celery_state, state = agreement(setup, task_id)
        if state in AGREES and AGREES[state] == celery_state:
            return celery_state, state, time.time()
        return None

    try:
        found: tuple[str, TaskState, float] = wait_for(agreed, timeout=20, interval=0.005,
                                                       message=f"{task_id} to agree")
    except AssertionError:
        raise AssertionError(f"{task_id}: Celery and the record disagree: "
                             f"{agreement(setup, task_id)}\n{worker.log[-5000:]}") from None
    return found


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unencodable_result_fails_in_celery_and_in_the_record(setup_for, tmp_path, layout):
    setup = setup_for(layout)
    worker = setup.worker(tmp_path)
    try:
        plain = setup.task("plain_unencodable").delay()
        tracked = setup.task("jobbers_unencodable_save").delay()
        for result in (plain, tracked):
            with pytest.raises(EncodeError):
                result.get(timeout=20)
            assert result.state == "FAILURE"
        assert str(tracked.result) == str(plain.result)
        record = wait_for(lambda: (r := setup.jobbers.get(tracked.id)) is not None
                          and r.state is S.FAILED and r, timeout=10,
                          message="the record to say failed")
        assert record.error is not None
        assert record.error.type == "kombu.exceptions.EncodeError"
        assert "not JSON serializable" in record.error.message
        [failed] = transitions(setup.jobbers, tracked.id, S.FAILED)
        assert failed.reason == "its result could not be stored"
        [entry] = wait_for(lambda: dead_letters(setup.jobbers, tracked.id), timeout=5,
                           message="the dead letter")
        assert entry.exception_type == "kombu.exceptions.EncodeError"
        # the worker goes on
        assert setup.task("jobbers_ret").delay(5).get(timeout=20) == 5
        wait_for(lambda: setup.jobbers.get(tracked.id).state is S.FAILED, timeout=5)
    finally:
        worker.kill()


@pytest.mark.parametrize("point", ["after_step", "after_write"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_kill_between_the_record_and_the_result_leaves_them_agreeing(setup_for, tmp_path,
                                                                       layout, point):
    setup = setup_for(layout)
    worker = setup.worker(tmp_path, ENDING_PROJ_KILL=point)
    windows = []
    try:
        if point == "after_write":  # plain Celery: the kill after its write keeps SUCCESS
            plain = setup.task("plain_ret").delay("p")
            assert plain.get(timeout=20) == "p"
            wait_for(lambda: setup.killed_at(plain.id), timeout=5, message="the kill")
            assert plain.state == "SUCCESS"
        for i in range(3):
            result = setup.task("jobbers_ret").delay(i)
            killed = wait_for(lambda: setup.killed_at(result.id), timeout=20,  # noqa: B023
                              message="the fault to be injected")
            celery_state, state, at = wait_agreed(setup, result.id, worker)
            assert (celery_state, state) == ("SUCCESS", S.COMPLETED)
            assert result.get(timeout=5) == i
            assert setup.runs(result.id) == 1
            windows.append(max(0.0, at - killed))
    finally:
        worker.kill()
    print(f"{layout}, kill {point}: agreed {', '.join(f'{w:.3f}' for w in windows)} s "
          "after the kill")
    assert max(windows) < WINDOW_S
