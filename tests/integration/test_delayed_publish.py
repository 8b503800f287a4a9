"""``apply_async(countdown=...)``/``eta=`` on a JobbersTask waits in Redis, not in an ETA
message (docs/howto/retries.md, "Delayed first runs"): recorded ``scheduled`` with its
``run_at``, listed by ``scheduled()``, published by a worker's scheduler when due. The worker
runs with a Redis-broker ``visibility_timeout`` of 1 s (swept every second), shorter than the
countdown: an ETA message it held would come back from kombu's ``unacked`` hash.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import ms, path, unique, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
VISIBILITY_S = 1.0


def _at_the_broker(r, task_id: str) -> int:
    """Copies of ``task_id``'s message the broker holds: in the queue, or taken by a worker
    and not acknowledged (kombu's ``unacked`` hash, what the visibility timeout restores)."""
    queued = [m for m in r.lrange("celery", 0, -1) if task_id in str(m)]
    unacked = [m for m in r.hvals("unacked") if task_id in str(m)]
    return len(queued) + len(unacked)


def test_a_countdown_waits_in_redis_and_runs_once(proj, worker_factory, r):
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=1,
                            env={"PROJ_VISIBILITY": str(VISIBILITY_S)})
    key = unique("countdown")
    countdown = 3 * VISIBILITY_S
    result = proj.record_run.apply_async((key,), countdown=countdown, expires=60)
    record = jobbers.get(result.id)
    assert record is not None
    assert record.state is S.SCHEDULED
    run_at = ms(record.run_at)
    assert run_at - ms(record.submitted_at) == countdown * 1000
    assert result.id in [t.task_id for t in jobbers.scheduled()]
    assert path(jobbers, result.id) == [("unsubmitted", "submitted"), ("submitted", "scheduled")]
    assert jobbers.history(result.id)[-1].reason == "delayed first run (countdown)"
    assert _at_the_broker(r, result.id) == 0  # nothing waits at the broker

    assert result.get(timeout=30) == 1
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    assert record.attempt == 1
    assert ms(record.started_at) >= run_at
    assert path(jobbers, result.id)[2:] == [("scheduled", "submitted"), ("submitted", "started"),
                                            ("started", "completed")]
    # ran once, and no copy is left anywhere that a visibility timeout could bring back
    wait_for(lambda: _at_the_broker(r, result.id) == 0, message="the message to be acked")
    assert r.lrange(key, 0, -1) == [f"{result.id}:1"]
    # delivered once (Celery's ETA message, held unacked for the countdown, is delivered
    # again at every visibility timeout: its copies are refused at start, but they come)
    received = f"Task proj.record_run[{result.id}] received"
    wait_for(lambda: f"proj.record_run[{result.id}] succeeded" in worker.log,
             message="the worker to log the run")
    assert worker.log.count(received) == 1


def test_an_eta_whose_expires_passed_when_due_does_not_run(proj, worker_factory, r):
    """As in Celery: the worker revokes an expired message, and the record ends
    ``cancelled``, the result REVOKED."""
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=1)
    key = unique("expired")
    eta = datetime.now(UTC) + timedelta(seconds=0.5)
    result = proj.record_run.apply_async((key,), eta=eta, expires=0.2)
    assert jobbers.get(result.id).state is S.SCHEDULED
    record = wait_state(jobbers, result.id, S.CANCELLED, worker=worker)
    assert record.attempt == 0
    assert path(jobbers, result.id)[-2:] == [("scheduled", "submitted"),
                                             ("submitted", "cancelled")]
    assert jobbers.history(result.id)[1].reason == "delayed first run (eta)"
    assert jobbers.history(result.id)[-1].reason.startswith("expired: ")
    wait_for(lambda: result.state == "REVOKED", message="the result to say REVOKED")
    assert r.lrange(key, 0, -1) == []
