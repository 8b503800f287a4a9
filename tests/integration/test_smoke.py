from __future__ import annotations

import pytest

from jobbers_celery import TaskState
from tests.conftest import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def test_add_completes_on_a_prefork_worker(proj, worker_factory):
    worker_factory(pool="prefork", concurrency=1)
    result = proj.add.delay(2, 3)
    assert result.get(timeout=20) == 5
    record = wait_for(lambda: (r := proj.jobbers.get(result.id)) and r.state == TaskState.COMPLETED and r,
                      message="completed record")
    assert record.attempt == 1
    assert [t.to_state for t in proj.jobbers.history(result.id)] == [
        TaskState.SUBMITTED, TaskState.STARTED, TaskState.COMPLETED]
