"""Refused messages, without a broker: the reasons, the request that refuses a malformed
message instead of stopping the worker, and dead letters that cannot be published again."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import InvalidTaskError
from kombu.exceptions import ContentDisallowed, DecodeError
from kombu.message import Message

from jobbers_celery import UNPUBLISHABLE, DeadLetter, JobbersTask
from jobbers_celery.deadletter.entry import dead_letter_entry
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.store import StepResult
from jobbers_celery.worker.refusals import record_refusal, refusal_reason
from jobbers_celery.worker.request import JobbersRequest

PICKLE = "application/x-python-serialize"


def _message(body: Any, content_type: str = "application/json",
             headers: dict[str, Any] | None = None) -> Message:
    return Message(body=body, content_type=content_type, content_encoding="utf-8",
                   headers={"id": "t-1", "task": "unit.add", **(headers or {})},
                   delivery_info={}, properties={}, accept=["application/json"])


def test_reasons_name_what_was_refused() -> None:
    assert refusal_reason(_message(b"x", PICKLE), ContentDisallowed("untrusted")) == (
        f"content type {PICKLE} is not accepted by this worker (accept_content)")
    decode = refusal_reason(_message(b"{"), DecodeError("Expecting value: " + "x" * 500))
    assert decode.startswith("the message body could not be decoded as application/json: "
                             "Expecting value: ")
    assert len(decode) < 300  # a decoder's message may quote the body: cut
    assert refusal_reason(_message(b"[]"), None) == (
        "not a task message this worker can run (no 'task' header)")
    assert refusal_reason(_message(b"[]"), InvalidTaskError("invalid ETA value 'x'")) == (
        "not a valid task message: InvalidTaskError: invalid ETA value 'x'")


@pytest.mark.parametrize("headers", [None, "not a mapping", {}, {"id": "t-1"}])
def test_a_message_naming_no_task_is_left_alone(headers: Any) -> None:
    message = SimpleNamespace(headers=headers, content_type=PICKLE)
    record_refusal(SimpleNamespace(app=None, hostname="w"), message, None)  # never raises


def test_a_malformed_body_is_an_invalid_task_not_a_worker_crash() -> None:
    app = Celery("unit", broker="memory://", set_as_current=False)

    @app.task(base=JobbersTask, name="unit.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    good = JobbersRequest(_message(json.dumps([[1, 2], {}, {}])), app=app, task=add)
    assert good.args == [1, 2]
    for body in ({"x": 1}, "text", 5):
        with pytest.raises(InvalidTaskError, match="malformed task message"):
            JobbersRequest(_message(json.dumps(body)), app=app, task=add)
    with pytest.raises(InvalidTaskError, match="KeyError"):
        JobbersRequest(Message(body=json.dumps([[], {}, {}]), content_type="application/json",
                               content_encoding="utf-8", headers={"task": "unit.add"},
                               delivery_info={}, properties={}), app=app, task=add)


def _entry(msg: str | None) -> DeadLetter:
    raw = {"ver": "1", "queue": "celery"}
    if msg is not None:
        raw["msg"] = msg
    return dead_letter_entry(task_id="t-1", name="unit.add", reason="dropped",
                             result=StepResult(applied=True, previous="submitted", now_ms=1_700_000_000_000,
                                               attempt=1), raw=raw)


def test_dead_letters_without_json_arguments_say_they_cannot_be_published() -> None:
    usable = _entry(pl.dumps({"args": [1], "kwargs": {}, "options": {"queue": "celery"}}))
    assert usable.unpublishable is None
    assert usable.options == {"queue": "celery"}
    unusable = _entry(pl.dumps({"unserializable": True, "args": "[<object>]", "kwargs": "{}",
                                "options": {}}))
    assert (unusable.args, unusable.kwargs) == ([], {})
    assert unusable.unpublishable == "its arguments were not recorded as JSON"
    assert unusable.options == {UNPUBLISHABLE: "its arguments were not recorded as JSON"}
    assert DeadLetter.from_json(unusable.to_json()).unpublishable == unusable.unpublishable
    assert _entry(None).unpublishable == "no arguments were recorded"
