"""End to end: Celery's revoke and jobbers' cancel agree, wherever people look.

- A revoke with ``terminate`` (``app.control.revoke``, ``celery control terminate``; Flower's
  revoke calls the same control command) ends a running JobbersTask ``cancelled``, with the
  revoke as its reason and no dead letter, whatever its ``on_shutdown``: on prefork the
  child is interrupted; on threads (which cannot interrupt) at the task's next heartbeat.
- A task jobbers cancelled is REVOKED in Celery's result backend and in its task events
  (what Flower shows), as a task Celery revoked is.

Real worker subprocesses (``-E``: task events on) and a real event receiver, as Flower has.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from types import TracebackType
from typing import Any, Self

import pytest
import redis

from jobbers_celery import TaskState
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.integration.cancel_cases import CANCEL
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    PUBLISH,
    START,
    dead_letters,
    path,
    unique,
    wait_state,
)
from tests.integration.shutdown_cases import Job, running, starts, submit
from tests.integration.store_helpers import put_in_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
CANCEL_PENDING = [(S.SUBMITTED.value, S.CANCELLED.value)]
REVOKED_BY = "revoked with terminate (SIGTERM)"
#: Long enough never to end, or heartbeat, within a test (the policy tasks heartbeat every
#: ``step`` seconds).
LONG = {"seconds": 120, "step": 60}


class TaskEvents:
    """Celery's task events, received as Flower receives them (``app.events.Receiver``),
    in a thread while the block runs."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []

    def __enter__(self) -> Self:
        self.conn = self.app.connection_for_read()
        self.receiver = self.app.events.Receiver(self.conn, handlers={"*": self.seen.append})
        self.thread = threading.Thread(target=self.receiver.capture, daemon=True,
                                       kwargs={"limit": None, "timeout": None,
                                               "wakeup": False})
        self.thread.start()
        probe = str(uuid.uuid4())
        with self.app.events.default_dispatcher() as dispatcher:
            def heard() -> bool:  # the receiver is subscribed once it hears a probe
                dispatcher.send("task-probe", uuid=probe)
                return probe in self.ids("task-probe")
            wait_for(heard, timeout=15, interval=0.2, message="the event receiver")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.receiver.should_stop = True
        self.thread.join(10)
        self.conn.release()

    def ids(self, kind: str) -> set[str]:
        return {e.get("uuid", "") for e in list(self.seen) if e.get("type") == kind}

    def wait(self, kind: str, *task_ids: str) -> None:
        wait_for(lambda: set(task_ids) <= self.ids(kind), timeout=15,
                 message=f"{kind} events for {task_ids}")


def _revoked_in_celery(proj: Any, events: TaskEvents, *task_ids: str) -> None:
    """Celery agrees with the record: REVOKED in the result backend and a task-revoked
    event (Flower's state) for each (the worker's main process says so a moment after the
    task recorded it)."""
    for task_id in task_ids:
        wait_for(lambda task_id=task_id: proj.app.AsyncResult(task_id).state == "REVOKED",
                 timeout=10, message=f"{task_id} REVOKED in the result backend")
    events.wait("task-revoked", *task_ids)


def _assert_revoked_cancelled(proj: Any, r: redis.Redis, job: Job) -> None:
    jobbers = proj.jobbers
    assert path(jobbers, job.id) == PUBLISH + START + CANCEL, job.kind
    reason = jobbers.history(job.id)[-1].reason
    assert reason.startswith(REVOKED_BY), (job.kind, reason)
    assert dead_letters(jobbers, job.id) == [], job.kind
    assert starts(r, job) == 1, job.kind  # not resubmitted, not run again
    assert "cancel" not in jobbers.store.get_raw(job.id)


def test_revoke_terminate_on_prefork_ends_cancelled_whatever_on_shutdown(
        proj, worker_factory, r):
    app, jobbers = proj.app, proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=2, extra=["-E"])
    took: dict[str, float] = {}
    with TaskEvents(app) as events:
        # Two policies that used to win over the revoke (stalled + dead letter; resubmitted).
        jobs = [submit(proj, kind, *LONG.values()) for kind in ("stop", "resubmit")]
        running(proj, r, worker, *jobs)
        # Both slots busy: these two wait in the worker, one revoked by Celery (no
        # terminate), one cancelled by jobbers (REVOKED in the backend at once).
        by_celery = proj.record_run.delay(unique("revoked-queued")).id
        by_jobbers = proj.record_run.delay(unique("cancelled-queued")).id
        app.control.revoke(by_celery)
        assert jobbers.cancel(by_jobbers) is True
        assert app.AsyncResult(by_jobbers).state == "REVOKED"

        for job in jobs:
            start = time.monotonic()
            app.control.revoke(job.id, terminate=True)
            wait_state(jobbers, job.id, S.CANCELLED, worker=worker)
            took[job.kind] = time.monotonic() - start
        for job in jobs:
            _assert_revoked_cancelled(proj, r, job)

        # The slots are free: the queued ones are skipped, each cancelled once.
        record = wait_state(jobbers, by_celery, S.CANCELLED, worker=worker)
        assert record.attempt == 0
        assert path(jobbers, by_celery) == PUBLISH + CANCEL_PENDING
        assert jobbers.history(by_celery)[-1].reason == "revoked: the worker did not run it"
        wait_for(lambda: f"proj.record_run[{by_jobbers}]" in worker.log, timeout=10,
                 message="the worker to drop the cancelled message")
        assert path(jobbers, by_jobbers) == PUBLISH + CANCEL_PENDING

        # on_shutdown=continue, through the control API too; then on_shutdown=stop through
        # the command line (the same control command as Flower's revoke with terminate).
        cont = submit(proj, "continue", *LONG.values())
        cli = submit(proj, "stop", *LONG.values())
        running(proj, r, worker, cont, cli)
        start = time.monotonic()
        app.control.revoke(cont.id, terminate=True)
        wait_state(jobbers, cont.id, S.CANCELLED, worker=worker)
        took["continue"] = time.monotonic() - start
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "control",
             "terminate", "SIGTERM", cli.id],
            cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60,
            check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_state(jobbers, cli.id, S.CANCELLED, worker=worker)
        took["stop (CLI)"] = time.monotonic() - start
        for job in (cont, cli):
            _assert_revoked_cancelled(proj, r, job)

        _revoked_in_celery(proj, events, *(job.id for job in (*jobs, cont, cli)),
                           by_celery, by_jobbers)

    # The children that were interrupted serve on; nothing ran again meanwhile.
    follower = proj.add.delay(2, 3)
    assert follower.get(timeout=20) == 5
    assert path(jobbers, follower.id) == PUBLISH + START + COMPLETE
    jobbers.clean()
    for job in (*jobs, cont, cli):
        assert starts(r, job) == 1, job.kind
        assert jobbers.get(job.id).state == S.CANCELLED, job.kind
    assert worker.proc.poll() is None
    print("\n[prefork] revoke(terminate=True) -> cancelled: "
          + ", ".join(f"{kind} {s:.2f}s" for kind, s in took.items())
          + f"; {len(took)} of {len(took)} cancelled, 0 dead letters")


def test_revoke_terminate_on_threads_ends_cancelled_at_the_next_heartbeat(
        proj, worker_factory, r):
    app, jobbers = proj.app, proj.jobbers
    worker = worker_factory(pool="threads", concurrency=2, extra=["-E"])
    with TaskEvents(app) as events:
        job = submit(proj, "stop", 120, step=0.1)  # heartbeats every 0.1 s
        running(proj, r, worker, job)
        start = time.monotonic()
        replies = app.control.revoke(job.id, terminate=True, reply=True, timeout=5, limit=1)
        # Celery says it cannot interrupt a thread; jobbers recorded the cancellation.
        assert "NotImplementedError" in str(replies), replies
        wait_state(jobbers, job.id, S.CANCELLED, worker=worker)
        took = time.monotonic() - start
        assert path(jobbers, job.id) == PUBLISH + START + CANCEL
        assert jobbers.history(job.id)[-1].reason == f"{REVOKED_BY}; cancellation honoured"
        assert dead_letters(jobbers, job.id) == []
        assert "cancel" not in jobbers.store.get_raw(job.id)

        # jobbers.cancel() of a running task: REVOKED for Celery once the task stops.
        key = unique("hb-cancel")
        beating = proj.heartbeating.delay(key, 120).id
        wait_state(jobbers, beating, S.STARTED, worker=worker)
        assert jobbers.cancel(beating) is True
        wait_state(jobbers, beating, S.CANCELLED, worker=worker)
        assert jobbers.history(beating)[-1].reason == "cancellation honoured"

        _revoked_in_celery(proj, events, job.id, beating)
    assert starts(r, job) == 1
    print(f"\n[threads] revoke(terminate=True) -> cancelled at the next heartbeat in "
          f"{took:.2f}s; 1 of 1 cancelled, 0 dead letters; jobbers.cancel() -> REVOKED")


def test_a_revoke_keeps_its_reason_for_the_step_that_ends_the_task(make_store):
    """The store side, without a worker: the reason of a revoke heads the history of
    whichever step ends the task cancelled; the first cancellation request's reason stands;
    the kept reason goes with the flag."""
    store = make_store()
    revoked = "revoked with terminate (SIGTERM)"
    fence = {"wid": "w1", "name": "n", "worker": "w1@host"}

    put_in_state(store, "t1", S.STARTED)
    assert store.cancel("t1", revoked, keep_reason=True).outcome == "requested"
    res = store.end("t1", S.STALLED, fence=1, reason="shut down", cancellable=True,
                    cancel_reason="cancellation honoured: interrupted by its worker", **fence)
    assert res.applied
    assert res.state is S.CANCELLED
    assert store.history("t1")[-1].reason == (
        f"{revoked}; cancellation honoured: interrupted by its worker")
    assert not {"cancel", "cxl"} & set(store.get_raw("t1"))

    put_in_state(store, "t2", S.STARTED)  # jobbers.cancel() first: its reason stands
    assert store.cancel("t2", "cancelled by request").outcome == "requested"
    assert store.cancel("t2", revoked, keep_reason=True).outcome == "requested"
    res = store.end("t2", S.CANCELLED, fence=1, reason="cancellation honoured", **fence)
    assert res.applied
    assert store.history("t2")[-1].reason == "cancellation honoured"

    put_in_state(store, "t3", S.SUBMITTED)  # not started: cancelled at once, as before
    assert store.cancel("t3", revoked, keep_reason=True).outcome == "cancelled"
    assert store.history("t3")[-1].reason == revoked
    assert "cxl" not in store.get_raw("t3")


def test_a_frozen_attempt_its_worker_ends_is_announced_as_retried(proj, worker_factory):
    """Flower's view of a frozen task: once the cleaner declares attempt 1 stalled and the
    worker ends it, a ``task-retried`` event says so (it was recovered), and attempt 2's
    events follow to ``task-succeeded``; Celery's event state ends SUCCESS, not STARTED."""
    from celery.events.state import State

    from tests.integration.beat_helpers import Beat

    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=1, extra=["-E"])
    with TaskEvents(proj.app) as events, Beat(jobbers):
        result = proj.freezes.delay(unique("freezes"), 120.0)
        wait_state(jobbers, result.id, S.COMPLETED, timeout=40, worker=worker)
        events.wait("task-succeeded", result.id)
    kinds = [e["type"] for e in events.seen if e.get("uuid") == result.id]
    assert "task-retried" in kinds, kinds
    assert kinds.index("task-retried") < kinds.index("task-succeeded"), kinds
    assert "task-failed" not in kinds, kinds
    state = State()
    for event in events.seen:
        state.event(event)
    assert state.tasks[result.id].state == "SUCCESS"


def test_a_frozen_attempt_stalled_for_good_is_announced_as_failed(proj, worker_factory):
    """The same with no stall recovery left: ``task-failed``, and Celery's event state (what
    Flower shows) ends FAILURE instead of STARTED for ever."""
    from celery.events.state import State

    from tests.integration.beat_helpers import Beat

    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=1, extra=["-E"])
    with TaskEvents(proj.app) as events, Beat(jobbers):
        result = proj.freezes_unrecovered.delay(120.0)
        wait_state(jobbers, result.id, S.STALLED, timeout=40, worker=worker)
        events.wait("task-failed", result.id)
    state = State()
    for event in events.seen:
        state.event(event)
    assert state.tasks[result.id].state == "FAILURE"
    assert "stalled" in state.tasks[result.id].exception
