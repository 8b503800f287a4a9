"""Messages a worker refuses before running them (issue 14, point 6), as cases that run on
the Redis broker (test_refusals.py) and on RabbitMQ (test_on_rabbitmq.py).

Each message names a task the worker has, and the worker refuses it in its consumer: a
pickle body for a JSON-only worker (``ContentDisallowed``), a body that is not JSON
(``DecodeError``), a message without the ``task`` header, one with an invalid ``eta``
header (``InvalidTaskError``), a JSON body that is not ``[args, kwargs, embed]`` (which
stops a plain Celery worker). Each must end ``dropped`` with the reason, dead-lettered as
the task's policy says, and the pickle must never be loaded: its payload would create a
marker file if it were.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from jobbers_celery import TaskState
from jobbers_celery.worker.refusals import MessageRefused
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import (
    PUBLISH,
    dead_letters,
    path,
    transitions,
    unique,
    wait_state,
)

S = TaskState
DROP = [(S.SUBMITTED.value, S.DROPPED.value)]
REFUSED = f"{MessageRefused.__module__}.{MessageRefused.__qualname__}"
PICKLE = "application/x-python-serialize"


class Marker:
    """Unpickling this creates the file ``path`` (``open(path, "w")``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (str(self.path), "w")


def publish_raw(proj: Any, name: str, args: list[Any], body: bytes, content_type: str,
                drop_headers: tuple[str, ...] = (), record: bool = True,
                **headers: Any) -> str:
    """Publish a message for ``name`` as a jobbers client would (the submission recorded,
    the headers stamped, from the real arguments), with ``body`` on the wire instead of
    their encoding (``record=False``: as a client without jobbers). Returns its task id."""
    app = proj.app
    task_id = unique("refused")
    msg = app.amqp.as_task_v2(task_id, name, args=args, kwargs={})
    queue = app.amqp.queues[app.conf.task_default_queue]
    task = app.tasks[name]
    if record:
        proj.jobbers.recorder.publish(
            name, msg.headers, msg.body, queue.exchange.name, queue.routing_key,
            msg.properties, version=task.jobbers_options.version,
            dead_letter=task.jobbers_options.dead_letter_policy.value == "save")
    sent = {k: v for k, v in {**msg.headers, **headers}.items() if k not in drop_headers}
    with app.producer_or_acquire() as producer:
        producer.publish(body, exchange=queue.exchange, routing_key=queue.routing_key,
                         declare=[queue], content_type=content_type,
                         content_encoding="utf-8", headers=sent)
    return task_id


def refused_messages_end_dropped(proj: Any, worker_factory: Any, tmp_path: Path) -> None:
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=1)
    marker = tmp_path / "unpickled"
    key = unique("pickled")

    # a pickle message whose arguments jobbers could not record as JSON: no payload at all
    unsafe = proj.boom.apply_async((Marker(marker),), serializer="pickle")
    # the same for a task that saves no dead letters: its record keeps the unusable payload
    no_dlq = proj.add.apply_async((Marker(marker), 1), serializer="pickle")
    # a pickle message whose arguments its publisher recorded as JSON (never read from it)
    pickled = proj.sleepy_save.apply_async((0.0, key), serializer="pickle")
    not_json = publish_raw(proj, "proj.boom", ["a"], b"\x80\x04not json{", "application/json")
    no_task = publish_raw(proj, "proj.boom", ["b"], json.dumps([["b"], {}, {}]).encode(),
                          "application/json", drop_headers=("task",))
    # a pickle from a client without jobbers: no record, recorded by the worker as it drops it
    unrecorded = publish_raw(proj, "proj.boom", ["f"], pickle.dumps(([Marker(marker)], {}, {})),
                             PICKLE, record=False)
    # JSON, but not [args, kwargs, embed]: Celery's own Request would stop the worker
    not_a_task = publish_raw(proj, "proj.boom", ["d"], json.dumps({"x": 1}).encode(),
                             "application/json")
    bad_eta = publish_raw(proj, "proj.boom", ["c"], json.dumps([["c"], {}, {}]).encode(),
                          "application/json", eta="not a date")
    reasons = {
        unsafe.id: "content type application/x-python-serialize is not accepted by this "
                   "worker (accept_content)",
        pickled.id: "content type application/x-python-serialize is not accepted by this "
                    "worker (accept_content)",
        unrecorded: f"content type {PICKLE} is not accepted by this worker (accept_content)",
        not_json: "the message body could not be decoded as application/json: ",
        no_task: "not a task message this worker can run (no 'task' header)",
        not_a_task: "not a valid task message: InvalidTaskError: malformed task message: "
                    "ValueError: not enough values to unpack",
        bad_eta: "not a valid task message: InvalidTaskError: invalid ETA value 'not a date'",
    }
    for task_id, reason in reasons.items():
        record = wait_state(jobbers, task_id, S.DROPPED, worker=worker)
        assert path(jobbers, task_id) == PUBLISH + DROP, task_id
        if task_id == unrecorded:
            assert transitions(jobbers, task_id, S.SUBMITTED)[0].reason == (
                "recorded by the worker: no submission record")
        [dropped] = transitions(jobbers, task_id, S.DROPPED)
        assert dropped.reason is not None
        assert dropped.reason.startswith(f"refused by the worker: {reason}"), dropped.reason
        assert dropped.worker == worker.name
        assert record.attempt == 1
        assert record.started_at is None
        assert record.error is not None
        assert record.error.type == REFUSED
        assert record.error.message.startswith(reason)
        [entry] = wait_for(lambda t=task_id: dead_letters(jobbers, t), timeout=10,
                           message=f"the dead letter of {task_id}")
        assert entry.reason == "dropped"
        assert entry.exception_type == REFUSED
        assert entry.exception_message is not None
        assert entry.exception_message.startswith(reason)
    assert not marker.exists(), "the worker unpickled the refused message"
    record = wait_state(jobbers, no_dlq.id, S.DROPPED, worker=worker)
    assert transitions(jobbers, no_dlq.id, S.DROPPED)[0].reason == (
        f"refused by the worker: {reasons[unsafe.id]}")
    assert dead_letters(jobbers, no_dlq.id) == []  # dead_letter_policy none

    [entry] = dead_letters(jobbers, unrecorded)
    assert (entry.args, entry.kwargs, entry.name, entry.version) == ([], {}, "proj.boom", 1)
    assert entry.unpublishable == "its arguments were not recorded as JSON"

    # no JSON arguments recorded: the entry has none, and resubmitting it is refused
    [entry] = dead_letters(jobbers, unsafe.id)
    assert (entry.args, entry.kwargs) == ([], {})
    assert entry.unpublishable == "its arguments were not recorded as JSON"
    assert jobbers.resubmit_dead_letters([entry]) == []
    assert jobbers.resubmit([unsafe.id]) == []
    record = jobbers.get(unsafe.id)
    assert record is not None
    assert record.state == S.DROPPED
    assert path(jobbers, unsafe.id) == PUBLISH + DROP  # refused before any change

    # the record holds the unusable payload: the resubmit ends it dropped again, not
    # submitted with a publish nobody can make
    assert jobbers.resubmit([no_dlq.id]) == []
    assert path(jobbers, no_dlq.id) == PUBLISH + DROP + [
        (S.DROPPED.value, S.SUBMITTED.value), (S.SUBMITTED.value, S.DROPPED.value)]
    assert transitions(jobbers, no_dlq.id, S.DROPPED)[-1].reason == (
        "not resubmitted: its arguments were not recorded as JSON, so it cannot be "
        "published again")
    assert sum(jobbers.store.client.zcard(k.publishing)
               for k in jobbers.store.shards.keys) == 0

    # the arguments its publisher recorded as JSON: resubmitted, it runs (as JSON)
    [entry] = dead_letters(jobbers, pickled.id)
    assert entry.args == [0.0, key]
    assert entry.unpublishable is None
    assert jobbers.resubmit_dead_letters([entry]) == [pickled.id]
    wait_state(jobbers, pickled.id, S.COMPLETED, worker=worker)
    assert proj._redis().get(key) is not None

    # the worker goes on
    assert proj.add.delay(2, 3).get(timeout=20) == 5
    assert not marker.exists()
