"""A task with a multi-megabyte argument, on a real worker and a real Redis: jobbers stores its
payload once (the record's copy while it can run, the dead-letter entry's once it is dead),
warns once when it is published, and a resubmit from the dead-letter queue runs it with the
whole payload."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import dead_letters, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState

#: The argument: ~4.3 MiB, whose JSON Redis keeps in one 5 MiB allocation (jemalloc's size
#: classes are 1 MiB apart there), clear of both one copy and two.
SIZE = 4_500_000
#: A finished record (history included) stays within this.
RECORD_MAX = 1024


def _dataset(client: Any) -> int:
    """Redis's memory for the keys and values of this test's database (every key's
    ``MEMORY USAGE``, all of a hash's fields counted). Not the server's ``used_memory_dataset``:
    the session's Redis serves other tests' databases too, whose keys come and go (a flush,
    an expiry) while this test measures."""
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in client.scan_iter())


def _usage(client: Any, key: str) -> int:
    """``MEMORY USAGE`` of ``key``, every field counted (by default Redis samples 5)."""
    return int(client.memory_usage(key, samples=0) or 0)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "jobbers.lifecycle" and "jobbers_payload_warn_bytes" in r.getMessage()]


def _fail_and_dead_letter(proj: Any, worker: Any, data: str) -> str:
    """Publish ``big_payload(data)``, let ``worker`` fail it; returns the task id once its
    entry is written and its record has dropped its copy of the payload."""
    jobbers = proj.jobbers
    result = proj.big_payload.delay(data, f"proj:big:{uuid.uuid4().hex[:8]}")
    wait_state(jobbers, result.id, S.FAILED, worker=worker)
    wait_for(lambda: dead_letters(jobbers, result.id), timeout=10, message="the dead letter")
    task_key = jobbers.store.keys_of(result.id).task(result.id)
    wait_for(lambda: not jobbers.store.client.hexists(task_key, "msg"), timeout=10,
             message="the record to drop its copy of the payload")
    return str(result.id)


def test_a_big_payload_is_stored_once_and_resubmitted_whole(proj, worker_factory, caplog):
    jobbers = proj.jobbers
    client = jobbers.store.client
    keys = jobbers.store.keys
    # warm up every path (scripts loaded, indexes and the dead-letter hash created), then
    # stop the worker: the big message waits in the broker's queue at first
    worker = worker_factory(pool="prefork", concurrency=1)
    _fail_and_dead_letter(proj, worker, "small")
    worker.stop()
    before = _dataset(client)

    data = "x" * SIZE
    with caplog.at_level(logging.WARNING, logger="jobbers.lifecycle"):
        result = proj.big_payload.delay(data, f"proj:big:{uuid.uuid4().hex[:8]}")
    task_id = str(result.id)
    [warning] = _warnings(caplog)
    assert f"proj.big_payload[{task_id}]" in warning
    assert "jobbers_payload_warn_bytes=262144" in warning
    size = int(warning.split("is ", 1)[1].split(" bytes", 1)[0])
    assert SIZE < size < SIZE + 1024  # the JSON payload: the argument and a little more

    # published, no worker yet: jobbers' copy on the record, Celery's in the broker's message
    task_key = jobbers.store.keys_of(task_id).task(task_id)
    assert client.hstrlen(task_key, "msg") == size
    assert SIZE < _usage(client, task_key) < 1.5 * SIZE
    assert _usage(client, "celery") > 4 / 3 * SIZE  # base64 body in kombu's envelope

    worker = worker_factory(pool="prefork", concurrency=1)
    wait_state(jobbers, task_id, S.FAILED, worker=worker)
    [entry] = wait_for(lambda: dead_letters(jobbers, task_id), timeout=10,
                       message="the dead letter")
    assert entry.args[0] == data
    wait_for(lambda: not client.hexists(task_key, "msg"), timeout=10,
             message="the record to drop its copy")
    assert _usage(client, task_key) <= RECORD_MAX
    assert client.llen("celery") == 0
    assert client.hlen(keys.dead_letters) == 2  # the warm-up's entry and this one
    # One copy: the dead-letter entry (5 MiB in Redis). Two would be over 2 * SIZE. The
    # connections' buffers of the big commands are not counted; Redis frees them within
    # seconds anyway.
    wait_for(lambda: _dataset(client) - before < 1.5 * SIZE, timeout=15,
             message=f"Redis to hold one copy (grown by {_dataset(client) - before} B)")
    assert _dataset(client) - before > SIZE

    # resubmit: the payload comes back from the dead-letter entry, whole
    with caplog.at_level(logging.WARNING, logger="jobbers.lifecycle"):
        assert jobbers.resubmit([task_id]) == [task_id]
    record = wait_state(jobbers, task_id, S.COMPLETED, worker=worker)
    assert proj.app.AsyncResult(task_id).get(timeout=10) == SIZE  # the task got all of it
    assert record.attempt == 2
    assert jobbers.history(task_id)[-3].reason == "resubmitted (retry count reset)"
    assert _usage(client, task_key) <= RECORD_MAX  # completion dropped the copy again
    assert len(_warnings(caplog)) == 1  # jobbers' own publish does not warn again


def test_resubmit_from_the_dead_letter_entry_after_the_record_expired(proj, worker_factory,
                                                                       caplog):
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=1)
    data = "y" * 300_000  # above the default warning threshold, smaller than the first test's
    with caplog.at_level(logging.WARNING, logger="jobbers.lifecycle"):
        task_id = _fail_and_dead_letter(proj, worker, data)
    assert len(_warnings(caplog)) == 1
    jobbers.store.client.delete(jobbers.store.keys_of(task_id).task(task_id))  # what expiry does

    assert jobbers.resubmit([task_id]) == []  # no record: nothing to resubmit it from
    [entry] = dead_letters(jobbers, task_id)
    assert jobbers.resubmit_dead_letters([entry]) == [task_id]
    # the record created again counts on from the dead-lettered attempt
    assert wait_state(jobbers, task_id, S.COMPLETED, worker=worker).attempt == 2
    assert proj.app.AsyncResult(task_id).get(timeout=10) == len(data)


def test_a_record_without_payload_and_without_entry_is_not_resubmitted(proj, worker_factory,
                                                                         caplog):
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=1)
    task_id = _fail_and_dead_letter(proj, worker, "z" * 1000)
    jobbers.store.client.hdel(jobbers.store.keys.dead_letters, f"{task_id}:1")

    with caplog.at_level(logging.ERROR, logger="jobbers"):
        assert jobbers.resubmit([task_id]) == []
    assert f"task {task_id} cannot be republished" in caplog.text
    assert jobbers.get(task_id).state == S.FAILED  # left as it was, not stuck in submitted
