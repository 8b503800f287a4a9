"""``app.send_task`` by name stays Celery's wherever jobbers does not park a fair-share task
(worker/taskpublish.py ``fair_send_task``; found by review): an app made with
``autofinalize=False`` is not finalized by it, eager mode still sends the message, and
arguments the task's signature refuses are sent as Celery sends them."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.exceptions import AlwaysEagerIgnored
from celery.signals import before_task_publish

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory

SENT: list[str] = []


def _count(headers: dict[str, Any] | None = None, **_: Any) -> None:
    SENT.append((headers or {}).get("id", ""))


before_task_publish.connect(_count, weak=False, dispatch_uid="test_fair_send_task")


def _app(**kw: Any) -> tuple[Celery, InMemoryStore]:
    app = Celery("fair_send_task", broker="memory://", **kw)
    # never consumed: a queue of its own, which no embedded worker of another test in this
    # process (the memory transport is the process's) takes from
    app.conf.task_default_queue = "fst-unconsumed"
    store = InMemoryStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    return app, store


def test_an_app_not_finalized_stays_so() -> None:
    app, _ = _app(autofinalize=False)
    result = app.send_task("fst.other", args=(1,))
    assert result.id in SENT
    assert not app.finalized


def test_eager_mode_sends_the_message_as_celery_does() -> None:
    app, _ = _app()

    @app.task(base=JobbersTask, name="fst.keyed", shared=False, max_concurrent=1,
              concurrency_key="tenant")
    def keyed(tenant: str) -> str:
        return tenant

    app.conf.task_always_eager = True
    with pytest.warns(AlwaysEagerIgnored):  # Celery's own warning
        result = app.send_task("fst.keyed", args=("a",))
    assert result.id in SENT  # sent, not run in the process
    assert type(result).__name__ == "AsyncResult"


def test_arguments_the_task_refuses_are_sent_as_celery_sends_them() -> None:
    app, store = _app()

    @app.task(base=JobbersTask, name="fst.keyed2", shared=False, max_concurrent=1,
              concurrency_key="tenant")
    def keyed2(tenant: str) -> str:
        return tenant

    result = app.send_task("fst.keyed2", args=("a", "too", "many"))  # no TypeError here
    assert result.id in SENT
    record = store.get(result.id)
    assert record is not None
    assert record.state is TaskState.SUBMITTED
