"""The stall-recovery cases run on two brokers, and the helpers they share with test_stalls.py.

test_stalls.py (Redis broker) and test_on_rabbitmq.py (RabbitMQ) call them with the same
arguments.
"""

from __future__ import annotations

import functools
import os
import re
import signal
from datetime import datetime
from typing import Any

from jobbers_celery import TaskState
from jobbers_celery.lifecycle.liveness import HALT_GRACE_S
from tests.conftest import wait_for
from tests.integration import shutdown_cases
from tests.integration.beat_helpers import Beat
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    PUBLISH,
    START,
    dead_letters,
    ms,
    path,
    transitions,
    unique,
    wait_state,
)
from tests.integration.stall_helpers import LOST_AFTER_S

S = TaskState

INTERVAL_S = 1.0         # proj: jobbers_cleaner_interval
MAX_HB_S = 2.0           # proj.resumable: max_heartbeat_interval

STALL = [(S.STARTED.value, S.STALLED.value), (S.STALLED.value, S.SUBMITTED.value)]

HB_REASON = re.compile(
    r"^stalled: no heartbeat for (?P<silent>\d+\.\d)s \(max_heartbeat_interval 2\.0s\); "
    r"last heartbeat (?P<hb>\S+); worker (?P<worker>\S+)$")
WORKER_REASON = re.compile(
    r"^stalled: worker (?P<worker>\S+) \((?P<wid>\S+)\) not seen for (?P<silent>\d+\.\d)s, "
    r"since (?P<seen>\S+) \(jobbers_worker_lost_after 3\.0s\); last heartbeat (?P<hb>\S+)$")


def iso_ms(text: str) -> int:
    return ms(datetime.fromisoformat(text))


def worker_running(jobbers: Any, task_id: str, workers: list[Any]) -> Any:
    record = wait_state(jobbers, task_id, S.STARTED)
    [worker] = [w for w in workers if w.name == record.worker]
    return worker


def stop_group(worker: Any, sig: int) -> None:
    os.killpg(worker.proc.pid, sig)


def killed_worker_task_is_stalled_and_resumed_once_on_another_worker(
        proj, worker_factory, task, pool):
    """The whole worker is SIGKILLed mid-task. ``resumable`` heartbeats (the verdict may
    come from its heartbeat deadline or from worker liveness); ``silent`` never does, so
    only worker liveness finds it. Both are recovered once (max_stall_recoveries=1) and
    complete on the other worker; ``resumable`` resumes at its checkpoint."""
    jobbers = proj.jobbers
    workers = [worker_factory(pool=pool, concurrency=1) for _ in range(2)]
    key = unique(task)
    steps = 8
    with Beat(jobbers) as beat:
        if task == "resumable":
            result = proj.resumable.delay(key, steps, 0.5)
        else:
            result = proj.silent.delay(key, 2.0)
        victim = worker_running(jobbers, result.id, workers)
        [survivor] = [w for w in workers if w is not victim]
        if task == "resumable":  # a few steps done, checkpoints saved
            wait_for(lambda: proj._redis().llen(key) >= 3, message="three steps")
        else:
            wait_for(lambda: proj._redis().llen(key) >= 1, message="the task body")
        started = jobbers.get(result.id)

        before_ms = jobbers.store.now_ms()  # the worker was seen before this, the kill after
        stop_group(victim, signal.SIGKILL)
        victim.proc.wait(10)
        killed_ms = jobbers.store.now_ms()

        wait_for(lambda: transitions(jobbers, result.id, S.STALLED), timeout=15,
                 message="the stall verdict")
        done = wait_state(jobbers, result.id, S.COMPLETED, timeout=30, worker=survivor)
    assert not beat.errors

    [stalled] = transitions(jobbers, result.id, S.STALLED)
    latency_ms = ms(stalled.at) - killed_ms
    print(f"\n[{task}/{pool}] kill -> stalled: {latency_ms} ms "
          f"(bound {LOST_AFTER_S + 2 * INTERVAL_S:.0f} s); {stalled.reason}")
    assert 0 < latency_ms <= (LOST_AFTER_S + 2 * INTERVAL_S) * 1000
    assert stalled.attempt == 1
    assert stalled.worker == victim.name

    # the evidence: which clock ran out, when the task or its worker was last heard of
    hb = worker_seen = None
    if (m := HB_REASON.match(stalled.reason or "")) is not None:
        assert task == "resumable", "silent has no max_heartbeat_interval"
        hb = iso_ms(m["hb"])
        assert float(m["silent"]) >= MAX_HB_S  # printed to 0.1 s
        assert m["worker"] == victim.name
    else:
        m = WORKER_REASON.match(stalled.reason or "")
        assert m is not None, stalled.reason
        assert m["worker"] == victim.name
        assert m["wid"].startswith(f"{victim.name}:{victim.proc.pid}:")
        worker_seen = iso_ms(m["seen"])
        hb = iso_ms(m["hb"])
        assert float(m["silent"]) >= LOST_AFTER_S  # printed to 0.1 s
        # seen alive shortly before the kill: it refreshes every 0.6 s
        assert before_ms - 2000 <= worker_seen <= killed_ms
    if task == "silent":
        assert worker_seen is not None, "a task without heartbeats is found by liveness"
        assert hb == ms(started.heartbeat_at)  # the start step stamps it
    assert ms(started.started_at) <= hb <= killed_ms

    # recovered once, same id, attempt 2 on the survivor, completed
    assert path(jobbers, result.id) == PUBLISH + START + STALL + START + COMPLETE
    history = jobbers.history(result.id)
    assert [t.attempt for t in history] == [0, 1, 1, 1, 2, 2]
    assert history[3].reason == "stall recovery 1 of 1"
    assert history[4].worker == survivor.name
    assert done.attempt == 2
    assert done.worker == survivor.name

    runs = proj._redis().lrange(key, 0, -1)
    if task == "resumable":
        first = [int(r[2:]) for r in runs if r.startswith("1:")]
        second = [int(r[2:]) for r in runs if r.startswith("2:")]
        assert len(first) + len(second) == len(runs), runs
        assert first == list(range(len(first)))
        # resumed at its checkpoint: the step in flight at the kill is the only one done twice
        assert second == list(range(second[0], steps))
        assert second[0] in (len(first) - 1, len(first)), runs
        assert second[0] >= 2
        assert done.checkpoint == steps
        assert result.get(timeout=10) == steps
        print(f"[{task}/{pool}] runs: {runs}")
    else:
        assert [r.split(":", 1)[0] for r in runs] == ["1", "2"], runs
        assert runs[1].endswith(f":{survivor.name}")
        assert result.get(timeout=10) == "done"

    # the dead incarnation is forgotten once it has no task left
    wid = f"{victim.name}:{victim.proc.pid}:"
    wait_for(lambda: not any(w.startswith(wid) for k in jobbers.store.shards.keys
                             for w in jobbers.store.client.zrange(k.workers, 0, -1)),
             timeout=10, message="the dead incarnation to be forgotten")


#: The note the worker adds to the reason of the stall of an attempt it ended (liveness.py).
ENDED_NOTE = re.compile(r"; ended by its worker \(SIGTERM (?P<term>\d+\.\d)s"
                        r"(?:, SIGKILL (?P<kill>\d+\.\d)s)? after the verdict\)$")


def _noted_stall(jobbers: Any, task_id: str) -> Any:
    [stalled] = transitions(jobbers, task_id, S.STALLED)
    return ENDED_NOTE.search(stalled.reason or "") and stalled


def _no_message_left(r: Any, task_id: str) -> bool:
    held = shutdown_cases.broker(r)  # the module's: test_on_rabbitmq.py replaces it
    return held[task_id] == 0 and held["<unacked>"] == 0


def frozen_task_is_ended_by_its_worker_and_its_slot_runs_the_next(proj, worker_factory, r):
    """prefork -c 1: attempt 1 of ``freezes`` stops heartbeating. Once the cleaner declares
    it stalled, the worker ends it (SIGTERM; SIGKILL after the grace when the task ignores
    SIGTERM: billiard replaces the child), and the recovered attempt 2 runs in the one slot.
    The stall's history entry says how it ended; no failure, no dead letter."""
    jobbers = proj.jobbers
    client = proj._redis()  # the Redis the task bodies write their marks to
    worker = worker_factory(pool="prefork", concurrency=1)
    figures = []
    with Beat(jobbers) as beat:
        for deaf in (False, True):
            key = unique("freezes")
            result = proj.freezes.delay(key, 120.0, deaf)
            wait_state(jobbers, result.id, S.COMPLETED, timeout=40, worker=worker)
            assert result.get(timeout=10) == 2
            assert path(jobbers, result.id) == PUBLISH + START + STALL + START + COMPLETE
            starts = transitions(jobbers, result.id, S.STARTED)
            assert [t.attempt for t in starts] == [1, 2]
            assert {t.worker for t in starts} == {worker.name}
            # the note follows at the liveness refresh after the attempt's request ended
            stalled = wait_for(functools.partial(_noted_stall, jobbers, result.id),
                               timeout=10, message="the note on the stall")
            reason = stalled.reason or ""
            assert reason.startswith("stalled: no heartbeat for "), reason
            m = ENDED_NOTE.search(reason)
            assert m is not None, reason
            assert (m["kill"] is not None) is deaf, reason
            [one, two] = [r.split(":") for r in client.lrange(key, 0, -1)]
            assert (one[0], two[0]) == ("1", "2")
            if deaf:
                assert one[1] != two[1], "the killed child was replaced"
            assert dead_letters(jobbers, result.id) == []
            # both messages are done with: none queued, none left unacknowledged (acks_late)
            wait_for(functools.partial(_no_message_left, r, result.id), timeout=10,
                     message="no message of the task left in the broker")
            freed_ms = ms(starts[1].at) - ms(stalled.at)
            figures.append((deaf, freed_ms, m.group(0)))
            # generous: the grace, a few liveness refreshes and a loaded machine
            assert freed_ms < (HALT_GRACE_S + 15) * 1000
    assert not beat.errors
    log = worker.log
    assert "Traceback" not in log, log
    assert "cannot stop a running task" not in log
    for deaf, freed_ms, note in figures:
        print(f"\n{'SIGTERM ignored' if deaf else 'SIGTERM'}: verdict -> attempt 2 started "
              f"in the freed slot: {freed_ms} ms ({note.lstrip('; ')})")
