"""The beat watch's cost on the task path, counted on a real Redis: the round trips the
thread running a periodic task waits on in ``task_prerun``/``task_postrun`` (the watch's
start and end writes), and the run still recorded, start and end, once the watch's writer
has sent them."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from redis.connection import AbstractConnection

from jobbers_celery import install
from jobbers_celery.lifecycle.periodic import ScheduleInfo
from jobbers_celery.worker import periodic as glue
from tests.conftest import wait_for

pytestmark = pytest.mark.redis


@pytest.fixture
def app(redis_url: str) -> Celery:
    app = Celery("roundtrips", broker="memory://", set_as_current=False)
    app.conf.update(jobbers_redis_url=redis_url, jobbers_store_shards=1)
    install(app)
    return app


class ReadsOnThisThread:
    """Counts the replies this thread waits for (one per round trip) while active."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.active = False
        me = threading.get_ident()
        real = AbstractConnection.read_response

        def counted(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if self.active and threading.get_ident() == me:
                self.count += 1
            return real(conn, *args, **kwargs)

        monkeypatch.setattr(AbstractConnection, "read_response", counted)


def _task(app: Celery, task_id: str) -> Any:
    request = SimpleNamespace(periodic_task_name="tick", id=task_id)
    return SimpleNamespace(name="proj.tick", app=app, request=request)


def test_a_periodic_runs_start_and_end_cost_the_task_no_round_trip(app, monkeypatch):
    jobbers = install(app)
    jobbers.periodic.learn([ScheduleInfo.of("tick", "proj.tick", "<freq: 10>", 10_000, None)],
                           "config")
    reads = ReadsOnThisThread(monkeypatch)
    for task_id in ("run-0", "run-1"):  # the first run loads the script: not counted
        task = _task(app, task_id)
        reads.count, reads.active = 0, task_id == "run-1"
        glue.on_task_prerun(task_id=task_id, task=task)
        started = reads.count
        glue.on_task_postrun(task_id=task_id, task=task, state="SUCCESS")
        reads.active = False
    print(f"\nround trips the task's thread waited on: start {started}, "
          f"end {reads.count - started}")
    assert reads.count == 0

    def recorded() -> Any:
        (s,) = jobbers.periodic.schedules(runs=5) or (None,)
        return s is not None and len(s.runs) == 2 and all(r.ended_at for r in s.runs) and s
    s = wait_for(recorded, timeout=5, message="the runs' start and end recorded")
    assert s.runs_total == 2
    assert {(r.id, r.state) for r in s.runs} == {("run-0", "SUCCESS"), ("run-1", "SUCCESS")}
    assert all(r.started_at is not None and not r.overlapping for r in s.runs)
