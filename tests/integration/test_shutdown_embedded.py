"""Embedded workers (``celery.contrib.testing.worker.start_worker``, what Celery's
``celery_worker`` pytest fixture runs): one process may start several, one after another.

The draining flag a worker's shutdown sets is process-wide; it must not outlive the worker
that set it, or every JobbersTask of the next embedded worker in the process is handed back
unrun (the next test's worker of a test suite, a user's suite using ``celery_worker``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from jobbers_celery import JobbersTask, TaskState, install
from tests.conftest import wait_for

pytestmark = [pytest.mark.redis]


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("embedded", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(jobbers_redis_url=redis_url, task_serializer="json",
                    accept_content=["json"], result_serializer="json",
                    worker_hijack_root_logger=False, jobbers_scheduler_interval=0.2)
    install(app)
    level = logging.getLogger().level
    yield app
    app.close()
    # start_worker sets the root logger to its loglevel ("error"): left so, every later test
    # of this pytest process that reads a warning with caplog sees nothing
    logging.getLogger().setLevel(level)


def test_a_second_embedded_worker_runs_jobbers_tasks(app: Celery) -> None:
    @app.task(base=JobbersTask, bind=True, name="embedded.add")
    def add(self: JobbersTask, x: int, y: int) -> int:
        return x + y

    jobbers = install(app)
    for n in range(2):  # the first worker's shutdown must not stop the second one's tasks
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
            result = add.delay(n, 1)
            assert result.get(timeout=10) == n + 1
            wait_for(lambda: (rec := jobbers.get(result.id)) is not None  # noqa: B023
                     and rec.state is TaskState.COMPLETED,
                     message=f"worker {n + 1}'s task completed")
        assert [t.to_state for t in jobbers.history(result.id)] == [
            TaskState.SUBMITTED, TaskState.STARTED, TaskState.COMPLETED]
