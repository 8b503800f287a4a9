"""A message over the worker's intake limits (issue 24) ends ``dropped`` with the reason and
the worker lives on: nested ~500 deep, such a message killed the prefork worker's main
process (``RecursionError`` pickling the request for the pool), came back and killed the
next one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobbers_celery import TaskState
from jobbers_celery.core.intake import MAX_DEPTH, MAX_ID_CHARS
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import (
    PUBLISH,
    dead_letters,
    path,
    transitions,
    wait_state,
)
from tests.integration.refusal_cases import publish_raw

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
LIMITS = "refused by the worker: over the worker's intake limits: "


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def test_a_deep_message_is_dropped_and_the_worker_lives(proj: Any, worker_factory: Any) -> None:
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=1)
    deep = proj.boom.apply_async((_nested(500),))
    # a client without jobbers, the depth in a header this time
    raw = publish_raw(proj, "proj.boom", ["x"], json.dumps([["x"], {}, {}]).encode(),
                      "application/json", record=False, custom=_nested(MAX_DEPTH + 5))
    for task_id in (deep.id, raw):
        record = wait_state(jobbers, task_id, S.DROPPED, worker=worker)
        [dropped] = transitions(jobbers, task_id, S.DROPPED)
        assert dropped.reason == (f"{LIMITS}its arguments or headers are nested deeper than "
                                  f"{MAX_DEPTH} levels"), dropped.reason
        assert record.started_at is None
        [entry] = wait_for(lambda t=task_id: dead_letters(jobbers, t), timeout=10,
                           message=f"the dead letter of {task_id}")
        assert entry.reason == "dropped"
        assert entry.exception_message is not None
        assert entry.exception_message.startswith("over the worker's intake limits")
    assert path(jobbers, deep.id) == [*PUBLISH, (S.SUBMITTED.value, S.DROPPED.value)]
    # the worker lives on, and runs what comes next; the messages are not delivered again
    assert proj.add.delay(2, 3).get(timeout=20) == 5
    assert worker.proc.poll() is None
    assert "RecursionError" not in worker.log
    assert len(transitions(jobbers, deep.id, S.DROPPED)) == 1


def test_an_over_long_task_id_is_never_made_a_key(proj: Any, worker_factory: Any) -> None:
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=1)
    long_id = "x" * (MAX_ID_CHARS + 1)
    proj.add.apply_async((1, 2), task_id=long_id)
    later_id = "z" * (MAX_ID_CHARS + 1)  # a countdown: not kept in the store either
    proj.add.apply_async((1, 2), task_id=later_id, countdown=0.2)
    ok = proj.add.apply_async((1, 2), task_id="y" * MAX_ID_CHARS)  # at the limit: runs
    assert ok.get(timeout=20) == 3
    for task_id in (long_id, later_id):
        said = f"refused message proj.add[{task_id[:200]}... [cut: {MAX_ID_CHARS + 1} " \
               f"characters in all]] not recorded: its task id has {MAX_ID_CHARS + 1} " \
               f"characters, over the limit of {MAX_ID_CHARS}"
        wait_for(lambda s=said: s in worker.log, timeout=10,
                 message="the worker to say why it refused the message")
        assert jobbers.get(task_id) is None
        assert not any(task_id in k for k in jobbers.store.client.scan_iter(count=1000))
    assert proj.add.delay(2, 3).get(timeout=20) == 5
    assert worker.proc.poll() is None


def test_a_task_id_with_a_lone_surrogate_is_refused_and_the_worker_goes_on(
        proj: Any, worker_factory: Any) -> None:
    """A JSON ``"\\ud800"`` decodes to a str no key (and no result backend) can hold: the
    worker's store step raised inside the task's own bookkeeping, nothing was recorded and
    the refusal's recording raised again. Now it is refused at intake, said once, escaped."""
    app = proj.app
    worker = worker_factory(pool="prefork", concurrency=1)
    task_id = "sur\ud800id"
    msg = app.amqp.as_task_v2(task_id, "proj.boom", args=["x"], kwargs={})
    queue = app.amqp.queues[app.conf.task_default_queue]
    with app.producer_or_acquire() as producer:
        producer.publish(json.dumps([["x"], {}, {}]), exchange=queue.exchange,
                         routing_key=queue.routing_key, declare=[queue],
                         content_type="application/json", content_encoding="utf-8",
                         headers=msg.headers)
    said = ("refused message proj.boom[sur\\ud800id] not recorded: its task id holds a lone "
            "surrogate (no UTF-8 form)")
    wait_for(lambda: said in worker.log, timeout=10,
             message="the worker to say why it refused the message")
    assert proj.add.delay(2, 3).get(timeout=20) == 5
    assert worker.proc.poll() is None
    assert "UnicodeEncodeError" not in worker.log
    assert "could not record" not in worker.log
