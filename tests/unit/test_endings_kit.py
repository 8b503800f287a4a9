"""How a task ends, on the in-memory kit (no Redis): a result the backend cannot encode is
recorded ``failed`` (on Celery's own result path, which records the completion after
Celery's write), an argument kombu cannot encode leaves a ``dropped`` record, a result that
is stored is ``completed``. End to end, per result layout and with kills:
tests/integration/test_result_endings.py, test_unsent_publish.py, test_worker_lost.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.exceptions import EncodeError

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.testing import embedded_worker, in_memory
from tests.conftest import wait_for

S = TaskState


class Unencodable:
    """Not JSON."""


@pytest.fixture
def kit() -> Iterator[tuple[Celery, Any]]:
    name = f"endings{uuid.uuid4().hex[:8]}"
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_serializer="json", result_serializer="json",
                    accept_content=["json"], worker_hijack_root_logger=False)
    jobbers = in_memory(app)

    @app.task(base=JobbersTask, bind=True, name=f"{name}.ret", shared=False)
    def ret(self: JobbersTask, value: Any) -> Any:
        return value

    @app.task(base=JobbersTask, bind=True, name=f"{name}.unencodable", shared=False,
              dead_letter_policy="save")
    def unencodable(self: JobbersTask) -> Any:
        return Unencodable()

    yield app, jobbers
    app.close()


def _task(app: Celery, short: str) -> Any:
    return app.tasks[f"{app.main}.{short}"]


def test_a_stored_result_is_completed_and_an_unencodable_one_failed(kit):
    app, jobbers = kit
    with embedded_worker(app):
        ok = _task(app, "ret").delay(7)
        bad = _task(app, "unencodable").delay()
        assert ok.get(timeout=10) == 7
        with pytest.raises(EncodeError):
            bad.get(timeout=10)
        assert wait_for(lambda: jobbers.get(ok.id).state is S.COMPLETED, timeout=5)
        record = wait_for(lambda: (r := jobbers.get(bad.id)).state is S.FAILED and r,
                          timeout=5, message="failed")
    assert record.error.type == "kombu.exceptions.EncodeError"
    [failed] = [t for t in jobbers.history(bad.id) if t.to_state is S.FAILED]
    assert failed.reason == "its result could not be stored"
    assert [e.task_id for e in jobbers.sink.entries] == [bad.id]


def test_an_unencodable_argument_leaves_a_dropped_record(kit):
    app, jobbers = kit
    task_id = str(uuid.uuid4())
    with pytest.raises(EncodeError):
        _task(app, "ret").apply_async((Unencodable(),), task_id=task_id)
    record = jobbers.get(task_id)
    assert (record.state, record.attempt) == (S.DROPPED, 0)
    [dropped] = [t for t in jobbers.history(task_id) if t.to_state is S.DROPPED]
    assert dropped.reason.startswith("never sent: publishing raised EncodeError: ")
    assert jobbers.sink.entries == []
