"""A delayed task whose id holds what an in-band reply would split on runs, and so does every
delayed task after it (issue 24): with ``due.lua`` joining ids with ``|``, a task id ``|``
with a countdown made the scheduler's parse raise on every pass, so no delayed task of any
shard was ever claimed again. Real worker, real scheduler, a client's ``countdown``."""

from __future__ import annotations

from typing import Any

import pytest

from jobbers_celery import TaskState
from tests.integration.lifecycle_helpers import wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

HOSTILE = ["|", "a|b|1.5", "x\n|\n", "0|"]


def test_hostile_delayed_ids_and_the_ones_after_them_run(proj: Any, worker_factory: Any) -> None:
    worker = worker_factory(pool="prefork", concurrency=1)
    hostile = [proj.add.apply_async((1, n), task_id=task_id, countdown=0.5)
               for n, task_id in enumerate(HOSTILE)]
    normal = [proj.add.apply_async((2, n), countdown=0.5) for n in range(3)]
    for n, result in enumerate(hostile):
        assert result.get(timeout=30) == 1 + n
    for n, result in enumerate(normal):
        assert result.get(timeout=30) == 2 + n
    for result in [*hostile, *normal]:
        record = wait_state(proj.jobbers, result.id, TaskState.COMPLETED, worker=worker)
        assert record.task_id == result.id
    assert "Traceback" not in worker.log
