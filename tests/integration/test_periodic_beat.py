"""The beat watch with a real ``celery beat`` and real ``celery worker`` subprocesses
(``tests/integration/periodic_proj.py``: one-second schedules, tolerance 2 s, checks
every 0.25 s): what beat schedules is learned, each run recorded from its publish to its
end, overlapping runs found; beat stopped, its slots are reported missed by the workers
(the time from a lost slot to its alert is printed: run with ``-s``); a worker that does
not consume the schedule's queue, its runs are reported late; the cleaner runs on its own
queue without task events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import QUIET, ROOT, start_worker, subprocess_env, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

APP = "tests.integration.periodic_proj"


@pytest.fixture
def periodic_proj(redis_url: str) -> Any:
    import importlib

    return importlib.import_module(APP)


class Beat:
    def __init__(self, tmp_path: Path) -> None:
        self.log_path = tmp_path / "beat.log"
        with self.log_path.open("w") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", APP, "beat", "-s",
                 str(tmp_path / "schedule"), "--pidfile", str(tmp_path / "beat.pid"),
                 "-l", "INFO"],
                cwd=ROOT, env=subprocess_env(), stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True)

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"beat exited:\n{self.log_path.read_text()}")
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


@pytest.fixture
def beat(periodic_proj: Any, tmp_path: Path) -> Any:
    started = Beat(tmp_path)
    yield started
    started.stop()


@pytest.fixture
def workers(periodic_proj: Any, tmp_path: Path) -> Any:
    running: list[Any] = []

    def start(queues: str, env: dict[str, str] | None = None) -> Any:
        worker = start_worker(periodic_proj.app, APP, tmp_path, pool="threads",
                              concurrency=4, options=[*QUIET, "-Q", queues], env=env)
        running.append(worker)
        return worker

    yield start
    for worker in running:
        worker.kill()


def schedules(proj: Any) -> dict[str, Any]:
    return {s.name: s for s in proj.jobbers.periodic_tasks(runs=50)}


def alerts(proj: Any) -> list[dict[str, Any]]:
    client = proj.jobbers.store.client
    return [json.loads(a) for a in client.lrange(proj.ALERTS, 0, -1)]


def test_a_real_beat_is_watched_and_its_missed_slots_alert(periodic_proj, beat, workers):
    proj = periodic_proj
    workers("celery,jobbers")

    def learned_and_running() -> Any:
        beat.alive()
        found = schedules(proj)
        tick, slow = found.get("tick"), found.get("slow")
        if tick is None or slow is None or "jobbers.clean" not in found:
            return None
        done = [r for r in tick.runs if r.state == "SUCCESS"]
        return (len(done) >= 3 and slow.overlapping >= 1) and found

    found = wait_for(learned_and_running, timeout=30, interval=0.2,
                     message="beat's schedules learned, tick run, slow overlapping")
    tick = found["tick"]
    assert (tick.source, tick.task, tick.period_ms) == ("beat", "periodic.tick", 1000)
    assert tick.schedule == "<freq: 1.00 second>"
    run = next(r for r in tick.runs if r.state == "SUCCESS")
    assert run.slot_at is not None
    assert run.published_at is not None
    assert run.started_at is not None
    assert run.ended_at is not None
    assert run.slot_at <= run.published_at <= run.started_at <= run.ended_at
    assert found["jobbers.clean"].task == "jobbers.clean"
    assert any(a["kind"] == "periodic_overlap" and a["key"] == "slow" for a in alerts(proj))
    # the cleaner's passes come from beat through its own queue, with no task events
    status = wait_for(lambda: (s := proj.jobbers.cleaner_status()).by == "beat" and s,
                      timeout=10, message="a cleaner pass run by beat")
    assert not status.overdue
    assert proj.app.tasks["jobbers.clean"].send_events is False
    assert proj.app.conf.beat_schedule["jobbers.clean"]["options"] == {"queue": "jobbers"}

    before = {a["key"] for a in alerts(proj) if a["kind"] == "periodic_missed"}
    assert "tick" not in before
    cfg = proj.jobbers.config
    within = cfg.periodic_tolerance + 2 * cfg.periodic_check_interval + 10
    beat.stop()
    missed = wait_for(lambda: next((a for a in alerts(proj) if a["kind"] == "periodic_missed"
                                    and a["key"] == "tick"), None),
                      timeout=within, interval=0.1, message="the missed-slot alert of tick")
    tick = schedules(proj)["tick"]
    assert tick.missed >= 1
    first_missed = min(r.slot_at for r in tick.runs if r.state == "missed")
    latency_ms = missed["at"] - first_missed
    print(f"\nmissed slot -> alert: {latency_ms} ms (tolerance "
          f"{cfg.periodic_tolerance} s, check every {cfg.periodic_check_interval} s)")
    assert latency_ms > cfg.periodic_tolerance * 1000  # never before the tolerance
    # every watched schedule of the stopped beat is missed, the cleaner's own among them
    wait_for(lambda: {"tick", "slow", "jobbers.clean"} <= {
        a["key"] for a in alerts(proj) if a["kind"] == "periodic_missed"}, timeout=within,
        message="each schedule of the stopped beat reported missed")


def test_runs_no_worker_consumes_are_reported_late(periodic_proj, beat, workers):
    proj = periodic_proj
    workers("jobbers")  # the cleaner's queue only: tick and slow wait on celery

    def late() -> Any:
        beat.alive()
        tick = schedules(proj).get("tick")
        return tick is not None and tick.late >= 2 and tick
    tick = wait_for(late, timeout=30, interval=0.2, message="tick's unstarted runs late")
    flagged = [r for r in tick.runs if r.late]
    assert flagged
    assert all(r.started_at is None and r.published_at is not None for r in flagged)
    assert tick.missed == 0  # beat published every slot
    assert any(a["kind"] == "periodic_late" and a["key"] == "tick" for a in alerts(proj))
    # a worker on celery at last: the late runs start, each still counted once
    workers("celery")
    wait_for(lambda: any(r.id == flagged[0].id and r.started_at
                         for r in schedules(proj)["tick"].runs), timeout=20,
             message="the late run to start")
    again = schedules(proj)["tick"]
    assert next(r for r in again.runs if r.id == flagged[0].id).late


def test_a_missed_slot_reaches_a_webhook(periodic_proj, beat, workers):
    """End to end: the worker's alert service posts the missed slot to a local receiver
    (a rule on ``tick``); the time from the lost slot to the POST is printed."""
    from tests.integration.test_alerts_webhook import Receiver

    proj = periodic_proj
    receiver = Receiver()
    try:
        workers("celery,jobbers", env={"PERIODIC_WEBHOOK": receiver.url})
        wait_for(lambda: beat.alive() and (t := schedules(proj).get("tick")) is not None
                 and t.runs_total >= 2, timeout=30, message="tick learned and run")
        beat.stop()
        cfg = proj.jobbers.config
        got = wait_for(lambda: next(((at, b) for at, b in receiver.got
                                     if b["jobbers"]["kind"] == "periodic_missed"), None),
                       timeout=cfg.periodic_tolerance + 2 * cfg.periodic_check_interval + 10,
                       message="the missed-slot alert at the webhook")
        at, body = got
        assert body["jobbers"]["key"] == "tick"
        first = min(r.slot_at for r in schedules(proj)["tick"].runs if r.state == "missed")
        print(f"\nmissed slot -> webhook received: {at * 1000 - first:.0f} ms (tolerance "
              f"{cfg.periodic_tolerance} s, check every {cfg.periodic_check_interval} s)")
    finally:
        receiver.stop()
