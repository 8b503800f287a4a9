"""jobbers_celery.testing's fakes keep the store's rules: the one transition table refuses
what Redis refuses, a heartbeat of a stale attempt is rejected, a cancellation of a started
task waits for its next step, a delayed step comes due on the fake clock, and the sink keeps
one entry per attempt. End to end (an embedded worker on them): tests/distribution/test_howto_testing.py."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from jobbers_celery import DeadLetter, JobbersTask, TaskState
from jobbers_celery.core.states import TRANSITIONS
from jobbers_celery.deadletter.spool import spool_directory
from jobbers_celery.testing import (
    InMemoryDeadLetterSink,
    InMemoryStore,
    embedded_worker,
    in_memory,
)
from jobbers_celery.worker import shutdown
from tests.conftest import wait_for

S = TaskState


def _submitted(store: InMemoryStore, task_id: str = "t1") -> None:
    res = store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name="n",
                       create={"name": "n", "msg": "{}", "queue": "q"})
    assert res.applied
    assert res.epoch


def _started(store: InMemoryStore, task_id: str = "t1") -> int:
    res = store.start(task_id, name="n", worker="w@h", wid="w@h:1:a", heartbeat_ms=None,
                      cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={})
    assert res.state is S.STARTED
    return res.attempt


@pytest.mark.parametrize("to", list(TaskState))
def test_a_completed_task_leaves_for_nowhere(to: TaskState) -> None:
    store = InMemoryStore()
    _submitted(store)
    store.complete("t1", _started(store), name="n", worker=None, wid="w@h:1:a", fields={},
                   delete=(), write_result=None)
    res = store.step("t1", to, sources=[s for s, ts in TRANSITIONS.items() if to in ts])
    assert not res.applied
    assert (res.previous, res.why) == ("completed", "state")
    assert store.get("t1").state is S.COMPLETED  # type: ignore[union-attr]


def test_a_step_beyond_the_table_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="not in the transition table"):
        InMemoryStore().step("t1", S.COMPLETED, sources=(S.SUBMITTED,))


def test_the_record_and_history_read_as_the_real_store_reads_them() -> None:
    store = InMemoryStore()
    _submitted(store)
    attempt = _started(store)
    store.complete("t1", attempt, name="n", worker="w@h", wid="w@h:1:a", fields={},
                   delete=(), write_result=None)
    record = store.get("t1")
    assert record is not None
    assert (record.state, record.attempt, record.queue) == (S.COMPLETED, 1, "q")
    assert [(t.from_state, t.to_state) for t in store.history("t1")] == [
        (S.UNSUBMITTED, S.SUBMITTED), (S.SUBMITTED, S.STARTED), (S.STARTED, S.COMPLETED)]


def test_a_heartbeat_of_another_attempt_is_rejected_and_cancel_waits_for_it() -> None:
    store = InMemoryStore()
    _submitted(store)
    attempt = _started(store)
    assert not store.heartbeat("t1", attempt + 1).accepted
    assert store.cancel("t1", "by test").outcome == "requested"
    beat = store.heartbeat("t1", attempt, progress='{"done": 1}', checkpoint="1")
    assert beat.accepted
    assert beat.cancel_requested
    assert store.heartbeats[-1].checkpoint == "1"
    ended = store.end("t1", S.FAILED, fence=attempt, wid="w@h:1:a", name="n", worker=None,
                      reason="boom", cancellable=True)
    assert ended.state is S.CANCELLED  # the pending cancellation wins


def test_a_delayed_task_comes_due_on_the_fake_clock_and_is_claimed_once() -> None:
    store = InMemoryStore()
    _submitted(store)
    attempt = _started(store)
    store.end("t1", S.SCHEDULED, fence=attempt, wid="w@h:1:a", name="n", worker=None,
              reason="retry", delay_ms=60_000)
    assert store.due()[0] == []
    store.advance(61)
    ids, _ = store.due()
    assert ids == ["t1"]
    [claimed] = store.claim(ids, 30_000, "w@h")
    assert (claimed.task_id, claimed.queue) == ("t1", "q")
    assert store.claim(ids, 30_000, "w@h") == []
    store.confirm_published(["t1"])
    assert store.publishing() == {}


def test_the_sink_keeps_one_entry_per_attempt() -> None:
    sink = InMemoryDeadLetterSink()
    entry = DeadLetter(task_id="t1", name="n", version=None, queue=None, reason="failed",
                       args=[], kwargs={}, exception_type=None, exception_message=None,
                       traceback=None, attempt=1, retry_attempt=0, worker=None,
                       failed_at=datetime.now(UTC))
    sink.write(entry)
    sink.write_many([entry])
    assert sink.size() == 1
    assert sink.entry("t1", 1) is entry
    assert sink.of("t1") == [entry]



def test_each_in_memory_store_gets_the_tasks_of_the_worker_started_after_it() -> None:
    """The how-to's suite: a fresh store per test, a worker per test. The tasks built their
    collaborators over the first store once; without dropping them at in_memory(), the
    second test's task started and heartbeat in the first store (its cancel never seen, its
    worker never stopping: the suite hung)."""
    app = Celery("kit_two_stores", broker="memory://", backend="cache+memory://")
    app.conf.broker_transport_options = {"polling_interval": 0.01}

    @app.task(base=JobbersTask, bind=True, name="kit.beat", shared=False)
    def beat(self: JobbersTask, n: int) -> int:
        self.heartbeat(progress={"n": n})
        return n

    before = set(threading.enumerate())
    for n in (1, 2):
        store = InMemoryStore()
        in_memory(app, store, InMemoryDeadLetterSink())
        with embedded_worker(app, shutdown_timeout=10):
            result: Any = beat.delay(n)
            assert result.get(timeout=10) == n

            def completed(store: InMemoryStore = store, task_id: str = result.id) -> bool:
                record = store.get(task_id)
                return record is not None and record.state is S.COMPLETED

            wait_for(completed)
        assert [(h.task_id, h.progress) for h in store.heartbeats] == [
            (result.id, f'{{"n": {n}}}')]
        # and each worker leaves the process as it found it (embedded_worker)
        assert [t.name for t in set(threading.enumerate()) - before] == []
        assert not shutdown.draining()


def test_celerys_own_embedded_worker_leaves_no_jobbers_thread_running() -> None:
    """The ``celery_worker`` fixture stops its worker the cold way (``terminate``), which
    sends no ``worker_shutdown`` and skips the steps' ``stop``: jobbers' scheduler and
    liveness threads of every such worker went on running in the test process."""
    from celery.contrib.testing.worker import start_worker

    app = Celery("kit_plain_worker", broker="memory://", backend="cache+memory://")
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    in_memory(app)
    before = set(threading.enumerate())
    root = logging.getLogger()  # Celery's worker sets the root logger up: put it back after
    level, handlers = root.level, root.handlers[:]
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            pass
        left = [t.name for t in set(threading.enumerate()) - before]
        assert not [name for name in left if name.startswith("jobbers")]
    finally:
        shutdown.on_worker_init()
        root.setLevel(level)
        root.handlers[:] = handlers


class _DownSink(InMemoryDeadLetterSink):
    """An in-memory sink a test takes down (its database unreachable) and brings back."""

    down = True

    def write(self, entry: DeadLetter) -> None:
        if self.down:
            raise ConnectionError("sink database is down")
        super().write(entry)


def _files(directory: Path) -> set[Path]:
    return set(directory.rglob("*")) if directory.exists() else set()


def test_a_dead_letter_the_sink_refuses_waits_in_the_in_memory_outbox() -> None:
    """Issue 25: the kit's dispatcher held the Redis client: with the sink down it tried the
    (nonexistent) Redis socket, then wrote a spool file under the machine's default spool
    directory, which another in-memory run then drained into its own sink."""
    app = Celery("kit_outbox", broker="memory://", backend="cache+memory://")
    app.conf.broker_transport_options = {"polling_interval": 0.01}

    @app.task(base=JobbersTask, bind=True, name="kit.fails", shared=False,
              dead_letter_policy="save")
    def fails(self: JobbersTask) -> None:
        raise ValueError("no luck")

    store, sink = InMemoryStore(), _DownSink()
    jobbers = in_memory(app, store, sink)
    config = jobbers.config
    default_spool = spool_directory(config.dead_letter_spool, config.key_prefix,
                                    config.redis_url)
    before = _files(default_spool)
    assert jobbers.dead_letters.spool is None  # an injected store: no spool at all
    with embedded_worker(app, shutdown_timeout=10):
        result: Any = fails.delay()
        wait_for(lambda: len(store.parked) == 1)
    [entry] = store.parked
    assert (entry.task_id, entry.exception_type) == (result.id, "ValueError")
    assert sink.entries == []
    assert jobbers.dead_letters.pending_in_memory == 0  # in the outbox, not in memory
    assert _files(default_spool) == before

    sink.down = False  # the sink is back: the housekeeping's retry drains the outbox
    assert jobbers.dead_letters.retry_pending() == 1
    assert [e.task_id for e in sink.entries] == [result.id]
    assert store.parked == []
    assert jobbers.dead_letters.retry_pending() == 0
