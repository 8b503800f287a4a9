"""A task a worker drops for a version mismatch ends in Celery's own event stream, as Flower
reads it: a real worker (``-E``) of version 2 receives a message of version 1, and
``celery.events.state.State`` fed from ``app.events.Receiver`` ends the task FAILURE (with
the reason), not RECEIVED for ever (the ``task-rejected`` event alone ranks below RECEIVED
in ``celery.states.PRECEDENCE``). The record says ``dropped``. And a ``task-succeeded`` event shows the return value redacted."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery import states
from celery.events.state import State

from jobbers_celery import TaskState
from tests.conftest import Worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def test_a_task_dropped_for_its_version_ends_failed_in_celerys_event_state(
        proj: Any, worker_factory: Callable[..., Worker]) -> None:
    state = State()
    seen: list[str] = []

    def on_event(event: dict[str, Any]) -> None:
        seen.append(event.get("type", ""))
        state.event(event)

    conn = proj.app.connection_for_read()
    receiver = proj.app.events.Receiver(conn, handlers={"*": on_event})
    thread = threading.Thread(target=receiver.capture, daemon=True,
                              kwargs={"limit": None, "timeout": None, "wakeup": False})
    thread.start()
    try:
        probe = str(uuid.uuid4())
        with proj.app.events.default_dispatcher() as dispatcher:
            def heard() -> bool:  # subscribed once it hears a probe
                dispatcher.send("task-probe", uuid=probe)
                return "task-probe" in seen
            wait_for(heard, timeout=15, interval=0.2, message="the event receiver")

        worker_factory(pool="prefork", concurrency=1, env={"PROJ_VERSION": "2"},
                       extra=["-E"])
        result = proj.versioned.delay()  # published as version 1 (this process)

        def ended() -> bool:
            task = state.tasks.get(result.id)
            return task is not None and task.state in states.READY_STATES

        wait_for(ended, timeout=20, message="the dropped task to end in the event state")
        task = state.tasks[result.id]
        print(f"\nevents of {result.id}: {[t for t in seen if t.startswith('task-')]}; "
              f"state {task.state}: {task.exception}")
        assert task.state == states.FAILURE
        assert "message version 1 differs from worker version 2" in (task.exception or "")
        # the reject's task-rejected comes after and ranks lower: the state stays FAILURE
        wait_for(lambda: "task-rejected" in seen, timeout=10, message="task-rejected")
        assert state.tasks[result.id].state == states.FAILURE
        assert result.state == states.FAILURE  # the result backend agrees
        record = proj.jobbers.get(result.id)
        assert record is not None
        assert record.state is TaskState.DROPPED

        # a task returning what it was given: its task-succeeded event's result (Flower
        # shows it) is redacted as its log line is
        given = proj.add.delay([{"password": "hunter2-in-result"}], [])
        assert given.get(timeout=20) == [{"password": "hunter2-in-result"}]
        wait_for(lambda: getattr(state.tasks.get(given.id), "state", None) == states.SUCCESS,
                 timeout=10, message="the task-succeeded event")
        shown = state.tasks[given.id].result or ""
        assert "hunter2-in-result" not in shown, shown
        assert "password" in shown, shown
    finally:
        receiver.should_stop = True
        thread.join(10)
        conn.release()
