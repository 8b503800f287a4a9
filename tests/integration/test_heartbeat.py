"""End to end: ``self.heartbeat()`` through real workers: progress, checkpoints, the throttle,
the size limit, and what it does outside a worker."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
import redis

from jobbers_celery import CheckpointTooLarge, TaskState
from jobbers_celery.worker.task import CHECKPOINT_MAX_BYTES, HEARTBEAT_MIN_GAP_S
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    FAIL,
    IMMEDIATE_RETRY,
    PUBLISH,
    START,
    dead_letters,
    path,
    unique,
    wait_state,
)

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState


class HeartbeatCounter:
    """Counts, with Redis MONITOR, the heartbeat.lua runs for one task (its first read,
    ``HMGET <task> state attempt hb_iv cancel``, which no other script makes) and the
    heartbeats it accepted (its ``HSET <task> hb_at ...``, which only heartbeat.lua writes
    first). Runs, not EVALSHA requests: a worker's first call of a script this Redis has not
    loaded yet is answered NOSCRIPT and sent again once loaded (one run, two requests), and
    whether an earlier test loaded it depends on which tests ran before on this server."""

    def __init__(self, url: str, task_key: str) -> None:
        self.calls = 0
        self.accepted: list[float] = []
        self._key, self._hset = task_key, f"HSET {task_key} hb_at "
        self._read = f"HMGET {task_key} state attempt hb_iv cancel"
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._client = redis.Redis.from_url(url, decode_responses=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(5), "MONITOR did not start"

    def _run(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            for entry in monitor.listen():
                command = entry["command"]
                if entry["client_type"] == "lua" and command == self._read:
                    self.calls += 1
                elif (entry["client_type"] == "lua" and command.startswith(self._hset)
                        and " state " not in command):
                    # (the completion's rewrite of the whole hash may also start with hb_at:
                    # it carries the state field, a heartbeat never does)
                    self.accepted.append(float(entry["time"]))
                if self._stop.is_set():  # other traffic (liveness, scheduler) wakes us
                    return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._client.close()


def test_progress_and_checkpoint_show_on_the_record_while_running(proj, worker_factory):
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=2)
    key = unique("progress")
    # 12 steps of 0.4 s, a heartbeat with progress and checkpoint after each; the task's
    # max_heartbeat_interval=2 s makes the throttle 0.5 s: a new value every 0.8 s or so,
    # for 4.8 s (6 steps left a test process held up 1.5 s one value at most to see).
    steps = 12
    result = proj.resumable.delay(key, steps, 0.4)
    seen: list[dict[str, Any]] = []

    def progressed() -> bool:
        record = jobbers.get(result.id)
        running = record is not None and record.state == S.STARTED and record.progress
        if running and (not seen or seen[-1] != record.progress):
            seen.append(record.progress)
            # progress and checkpoint travel in the same heartbeat
            assert record.checkpoint == record.progress["done"]
            assert record.heartbeat_at is not None
            assert record.heartbeat_at >= record.started_at
        return len(seen) >= 2

    wait_for(progressed, timeout=15, interval=0.02, message="two progress updates while running")
    assert result.get(timeout=20) == steps
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    print(f"\nprogress seen while running: {seen}; on the completed record: {record.progress}")
    assert all(p["of"] == steps and 1 <= p["done"] < steps for p in seen)
    assert [p["done"] for p in seen] == sorted(p["done"] for p in seen)
    # A heartbeat throttled just before the end is not saved by the completion: the
    # completed record shows the last heartbeat that was sent.
    assert record.progress["of"] == steps
    assert record.progress["done"] >= seen[-1]["done"]
    assert record.checkpoint == record.progress["done"]
    assert [x.split(":")[0] for x in jobbers.store.client.lrange(key, 0, -1)] == ["1"] * steps


def test_checkpoint_is_handed_to_the_next_attempt_after_a_retry(proj, worker_factory):
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=2)
    key = unique("ckpt")
    result = proj.checkpointed.delay(key)
    # Attempt 1 sent {"step": 1}; its second checkpoint {"step": 2} was throttled and went
    # out with the retry step. Attempt 2 gets it as self.checkpoint.
    assert result.get(timeout=20) == {"step": 2}
    record = wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
    runs = [json.loads(x) for x in jobbers.store.client.lrange(key, 0, -1)]
    assert runs == [{"attempt": 1, "checkpoint": None}, {"attempt": 2, "checkpoint": {"step": 2}}]
    assert (record.attempt, record.retry_attempt) == (2, 1)
    assert record.checkpoint == {"step": 2}
    assert record.progress == {"phase": 2}
    assert path(jobbers, result.id) == PUBLISH + START + IMMEDIATE_RETRY + COMPLETE


def test_a_tight_heartbeat_loop_is_throttled(proj, worker_factory, redis_url):
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=2)
    task_id = str(uuid.uuid4())
    counter = HeartbeatCounter(redis_url, jobbers.store.keys_of(task_id).task(task_id))
    try:
        result = proj.hammer.apply_async((10_000, 3.0), task_id=task_id)
        duration = result.get(timeout=30)
        wait_state(jobbers, task_id, S.COMPLETED, worker=worker)
    finally:
        counter.stop()
    gaps = [round(b - a, 3) for a, b in zip(counter.accepted, counter.accepted[1:], strict=False)]
    print(f"\n10,000 heartbeat() calls in {duration:.2f}s -> {counter.calls} heartbeat.lua "
          f"calls, {len(counter.accepted)} accepted; gaps {gaps}")
    assert counter.calls == len(counter.accepted)  # every one sent was accepted
    assert counter.calls <= duration / HEARTBEAT_MIN_GAP_S + 2
    assert counter.calls >= 2  # but they are sent: the first at once, then one a second
    # Gaps as Redis saw the heartbeats, while the throttle counts from the worker's clock
    # read before each round trip: one send late by a NOSCRIPT reload or a pause of the
    # worker, the next not, narrows a gap by that delay. An unthrottled loop sends well
    # under a millisecond apart, and the bound on calls above still checks the rate.
    assert all(g >= HEARTBEAT_MIN_GAP_S - 0.3 for g in gaps)
    record = jobbers.get(task_id)
    assert record.progress is not None
    assert record.progress["i"] < 10_000


def test_checkpoint_over_the_limit_fails_the_task(proj, worker_factory):
    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=2)
    too_big = proj.big_checkpoint.delay(CHECKPOINT_MAX_BYTES)  # + 2 quotes as JSON
    fits = proj.big_checkpoint.delay(CHECKPOINT_MAX_BYTES - 2)
    record = wait_state(jobbers, too_big.id, S.FAILED, worker=worker)
    assert record.error is not None
    assert record.error.type == "jobbers_celery.core.errors.CheckpointTooLarge"
    assert record.error.message == (
        f"heartbeat checkpoint is {CHECKPOINT_MAX_BYTES + 2} bytes as JSON; the limit is "
        f"{CHECKPOINT_MAX_BYTES} bytes: store large state elsewhere and checkpoint a "
        f"reference to it")
    assert record.checkpoint is None
    assert path(jobbers, too_big.id) == PUBLISH + START + FAIL
    [entry] = wait_for(lambda: dead_letters(jobbers, too_big.id), message="dead letter")
    assert entry.exception_type == "jobbers_celery.core.errors.CheckpointTooLarge"

    assert fits.get(timeout=20) == "saved"
    record = wait_state(jobbers, fits.id, S.COMPLETED, worker=worker)
    assert record.checkpoint == "x" * (CHECKPOINT_MAX_BYTES - 2)


def test_heartbeat_outside_a_worker_does_nothing(proj):
    jobbers = proj.jobbers
    key = unique("direct")
    # Called directly: no record, no Redis round trip; the size check still runs, so unit
    # tests of task code meet it.
    assert proj.heartbeating(key, 0.05) == "done"
    with pytest.raises(CheckpointTooLarge):
        proj.big_checkpoint(CHECKPOINT_MAX_BYTES * 2)
    assert isinstance(proj.hammer(100, 0.01), float)
    # Eager (apply): the same.
    eager = proj.heartbeating.apply((key, 0.05))
    assert eager.get() == "done"
    assert jobbers.get(eager.id) is None
    assert jobbers.tasks() == []
    assert jobbers.store.client.lrange(key, 0, -1) == ["started", "started"]
