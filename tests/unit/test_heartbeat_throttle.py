"""``JobbersTask.heartbeat()`` without Redis: the throttle decides first, a throttled call
encodes nothing, what it keeps goes out with the next heartbeat sent or with the outcome,
and invalid values still reach the task (at the latest at the send) or are logged at the
outcome. The kit's in-memory store and a fake clock stand in for Redis and time; the request is pushed
as Celery's tracer does in a worker. End to end: tests/integration/test_heartbeat.py."""

from __future__ import annotations

import json
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from jobbers_celery import (
    AttemptSuperseded,
    CheckpointTooLarge,
    JobbersTask,
    TaskCancelled,
    TaskState,
    get_jobbers,
)
from jobbers_celery.store.base import Heartbeat
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory
from jobbers_celery.worker import heartbeat as heartbeat_module
from jobbers_celery.worker import task as task_module
from jobbers_celery.worker import taskbeat as taskbeat_module
from jobbers_celery.worker.shutdown import WorkerShuttingDown
from jobbers_celery.worker.task import (
    CHECKPOINT_MAX_BYTES,
    HEARTBEAT_MIN_GAP_S,
    PROGRESS_MAX_BYTES,
)


class SentStore(InMemoryStore):
    """The in-memory store keeping every heartbeat sent to it, accepted or not (JSON text as
    the real store gets it); ``outage`` makes it answer as an unreachable store does."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, Any]] = []
        self.outage = False

    def heartbeat(self, task_id: str, fence: int, *, progress: str | None = None,
                  checkpoint: str | None = None, name: str | None = None,
                  lease_cap_ms: int | None = None) -> Heartbeat:
        self.sent.append({"id": task_id, "fence": fence, "progress": progress,
                          "ckpt": checkpoint})
        if self.outage:
            return Heartbeat(accepted=False, cancel_requested=False, now_ms=0,
                             delivered=False)
        return super().heartbeat(task_id, fence, progress=progress, checkpoint=checkpoint,
                                 name=name, lease_cap_ms=lease_cap_ms)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(taskbeat_module, "time", c)  # the throttle's clock
    monkeypatch.setattr(heartbeat_module, "time", c)  # the sender's
    return c


@pytest.fixture
def dumps(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every value heartbeat() encodes."""
    encoded: list[Any] = []
    real = task_module.payload.dumps

    def counting(value: Any) -> str:
        encoded.append(value)
        return real(value)

    monkeypatch.setattr(task_module.payload, "dumps", counting)
    return encoded


APP = Celery("hb-unit", broker="memory://", set_as_current=False)


@APP.task(base=JobbersTask, bind=True, name="hb.loop")
def loop(self: JobbersTask) -> None:  # pragma: no cover - not run: requests are pushed
    pass


@APP.task(base=JobbersTask, bind=True, name="hb.fast", max_heartbeat_interval=2)
def fast(self: JobbersTask) -> None:  # pragma: no cover
    pass


@APP.task(base=JobbersTask, bind=True, name="hb.keep_going", on_shutdown="continue")
def keep_going(self: JobbersTask) -> None:  # pragma: no cover
    pass


@pytest.fixture
def app() -> Any:
    """The app, installed over a fresh in-memory store."""
    in_memory(APP, SentStore(), InMemoryDeadLetterSink())
    return APP


def _store(app: Any) -> SentStore:
    store = get_jobbers(app).store
    assert isinstance(store, SentStore)
    return store


def started(app: Any, task_id: str, name: str = "hb.loop", attempt: int = 1) -> None:
    """``task_id``'s attempt ``attempt`` started in the store (its heartbeats accepted)."""
    store = _store(app)
    if not store.get_raw(task_id):
        store.submit(task_id, sources=(TaskState.UNSUBMITTED,), reason="published",
                     name=name, create={"name": name, "queue": "celery",
                                        "attempt": str(attempt - 1)})
        store.start(task_id, name=name, worker="w@host", wid="w@host:1:a", heartbeat_ms=None,
                    cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={})


def running(app: Any, name: str = "hb.loop", task_id: str = "t1") -> Any:
    """The task with a worker's request pushed (tracked, attempt 1, started in the store)."""
    started(app, task_id, name)
    task = app.tasks[name]
    task.push_request(id=task_id, called_directly=False, is_eager=False,
                      hostname="w@host", jobbers_attempt=1, jobbers_checkpoint=None)
    return task


def sent(app: Any) -> list[dict[str, Any]]:
    return list(_store(app).sent)


def test_a_tight_loop_sends_the_first_call_then_nothing_until_the_gap_and_encodes_nothing(
        app, clock, dumps):
    task = running(app)
    try:
        for i in range(10_000):
            task.heartbeat(progress=i)
        assert sent(app) == [{"id": "t1", "fence": 1, "progress": "0", "ckpt": None}]
        assert dumps == [0]  # the first call, sent; the 9,999 throttled ones encode nothing
        clock.now += HEARTBEAT_MIN_GAP_S - 0.001
        task.heartbeat(progress=10_000)
        assert len(sent(app)) == 1
        clock.now += 0.001
        task.heartbeat(progress=10_001)
        assert sent(app)[1]["progress"] == "10001"
        assert dumps == [0, 10_001]
    finally:
        task.pop_request()


def test_a_throttled_value_goes_out_with_the_next_heartbeat_sent(app, clock, dumps):
    task = running(app)
    try:
        task.heartbeat()
        task.heartbeat(progress={"done": 1}, checkpoint=1)
        task.heartbeat(progress={"done": 2}, checkpoint=2)
        task.heartbeat(progress={"done": 3})  # the checkpoint stays 2
        assert task.checkpoint == 2  # this attempt's latest, as before
        clock.now += HEARTBEAT_MIN_GAP_S
        task.heartbeat()  # no value of its own: carries the pending ones
        assert sent(app)[1] == {"id": "t1", "fence": 1, "progress": '{"done": 3}', "ckpt": "2"}
        assert dumps == [{"done": 3}, 2]
        clock.now += HEARTBEAT_MIN_GAP_S
        task.heartbeat()  # nothing pending any more
        assert sent(app)[2] == {"id": "t1", "fence": 1, "progress": None, "ckpt": None}
    finally:
        task.pop_request()


def test_the_gap_is_a_quarter_of_a_short_max_heartbeat_interval(app, clock):
    task = running(app, "hb.fast")
    try:
        task.heartbeat(progress=1)
        clock.now += 0.49
        task.heartbeat(progress=2)
        clock.now += 0.01
        task.heartbeat(progress=3)
        assert [s["progress"] for s in sent(app)] == ["1", "3"]
    finally:
        task.pop_request()


def test_the_outcome_takes_what_is_pending_encoded_once(app, clock, dumps):
    task = running(app)
    try:
        task.heartbeat(progress=0)
        task.heartbeat(progress=[1, 2], checkpoint={"step": 7})
        assert dumps == [0]
        expected = {"progress": "[1, 2]", "ckpt": '{"step": 7}'}
        assert task._pending_checkpoint() == expected
        # a step resent after an outage takes it again, without encoding it again
        assert task._pending_checkpoint() == expected
        assert dumps == [0, [1, 2], {"step": 7}]
    finally:
        task.pop_request()


def test_nothing_pending_after_a_heartbeat_sent(app, clock):
    task = running(app)
    try:
        task.heartbeat(progress=1, checkpoint="a")
        assert task._pending_checkpoint() == {}
    finally:
        task.pop_request()


def test_what_is_kept_is_the_value_as_passed_even_if_the_task_changes_it(app, clock, dumps):
    task = running(app)
    try:
        task.heartbeat()
        flat = {"done": 1, "of": 10}
        task.heartbeat(checkpoint=flat)
        flat["done"] = 2  # e.g. about to work on the next item: not done yet
        assert dumps == []  # a flat dict of numbers is copied, not encoded
        nested = {"cursor": {"page": 1}}
        task.heartbeat(progress=nested)
        assert dumps == [nested]  # nested: encoded at the call (that is the copy)
        nested["cursor"]["page"] = 2
        assert task._pending_checkpoint() == {"progress": '{"cursor": {"page": 1}}',
                                              "ckpt": '{"done": 1, "of": 10}'}
    finally:
        task.pop_request()


def test_a_non_json_value_raises_at_the_call_even_when_throttled(app, clock):
    task = running(app)
    try:
        task.heartbeat(progress=1)
        with pytest.raises(TypeError, match="heartbeat progress must be JSON-serializable"):
            task.heartbeat(progress={"when": object()})
        with pytest.raises(TypeError, match="heartbeat checkpoint must be JSON-serializable"):
            task.heartbeat(checkpoint={1, 2})
        assert task._pending_checkpoint() == {}  # neither was kept
    finally:
        task.pop_request()


def test_an_oversize_throttled_value_raises_at_the_next_heartbeat_sent_and_is_dropped(
        app, clock):
    task = running(app)
    try:
        task.heartbeat(progress=1)
        task.heartbeat(progress="x" * PROGRESS_MAX_BYTES, checkpoint=5)  # kept: a string
        clock.now += HEARTBEAT_MIN_GAP_S
        with pytest.raises(CheckpointTooLarge, match="heartbeat progress is 16386 bytes"):
            task.heartbeat()
        assert len(sent(app)) == 1  # nothing was sent
        task.heartbeat()  # the task goes on: the bad value is gone, the checkpoint not
        assert sent(app)[1] == {"id": "t1", "fence": 1, "progress": None, "ckpt": "5"}
    finally:
        task.pop_request()


def test_a_value_replaced_before_it_was_sent_is_never_checked(app, clock):
    task = running(app)
    try:
        task.heartbeat(progress=1)
        task.heartbeat(checkpoint="x" * CHECKPOINT_MAX_BYTES)  # would be too large
        task.heartbeat(checkpoint="small")
        clock.now += HEARTBEAT_MIN_GAP_S
        task.heartbeat()
        assert sent(app)[1]["ckpt"] == '"small"'
    finally:
        task.pop_request()


def test_an_invalid_value_pending_at_the_outcome_is_logged_and_left_out(app, clock, caplog):
    task = running(app)
    try:
        task.heartbeat(progress=1)
        task.heartbeat(progress="y" * PROGRESS_MAX_BYTES, checkpoint=3)
        with caplog.at_level(logging.ERROR, logger="jobbers.task"):
            assert task._pending_checkpoint() == {"ckpt": "3"}
            assert task._pending_checkpoint() == {"ckpt": "3"}  # logged once
        [rec] = caplog.records
        assert rec.getMessage().startswith(
            "hb.loop[t1] attempt 1: the progress its last heartbeat() left unsent is not "
            "saved with its outcome: heartbeat progress is 16386 bytes as JSON")
    finally:
        task.pop_request()


def test_outside_a_worker_every_call_checks_and_nothing_is_sent(app, clock, dumps):
    task = app.tasks["hb.loop"]
    for _ in range(2):  # not throttled: each call checks
        with pytest.raises(TypeError):
            task.heartbeat(progress=object())
        with pytest.raises(CheckpointTooLarge):
            task.heartbeat(checkpoint="x" * CHECKPOINT_MAX_BYTES)
    task.heartbeat(progress=1, checkpoint=2)
    task.push_request(id="eager", is_eager=True, called_directly=False)
    try:
        with pytest.raises(CheckpointTooLarge):
            task.heartbeat(progress="x" * PROGRESS_MAX_BYTES)
        task.heartbeat(progress=1)
    finally:
        task.pop_request()
    assert sent(app) == []
    assert task._pending_checkpoint() == {}


def test_each_attempt_has_its_own_throttle(app, clock):
    task = running(app, task_id="a")
    try:
        task.heartbeat(progress=1)
        task.heartbeat(progress=2)  # throttled, pending
    finally:
        task.pop_request()
    task = running(app, task_id="b")  # the next task on this thread, within the gap
    try:
        task.heartbeat(progress=3)
        assert task._pending_checkpoint() == {}
    finally:
        task.pop_request()
    assert [(s["id"], s["progress"]) for s in sent(app)] == [("a", "1"), ("b", "3")]


def test_a_task_called_directly_inside_an_attempt_records_nothing(app, clock):
    task = running(app)
    other = app.tasks["hb.fast"]
    try:
        task.heartbeat(progress=1)
        other.push_request(args=(), kwargs={})  # as other(...) called in the task body
        try:
            other.heartbeat(progress=2)
            with pytest.raises(TypeError):
                other.heartbeat(progress=object())
        finally:
            other.pop_request()
        task.heartbeat(progress=3)
        assert task._pending_checkpoint() == {"progress": "3"}
        assert len(sent(app)) == 1
    finally:
        task.pop_request()


def test_threads_each_have_their_own_attempt(app, clock):
    task = running(app, task_id="main")
    started(app, "thread", attempt=4)
    seen: dict[str, Any] = {}

    def other_thread() -> None:
        seen["request before"] = task._request_top()
        task.push_request(id="thread", called_directly=False, is_eager=False,
                          hostname="w@host", jobbers_attempt=4)
        try:
            seen["request"] = task._request_top() is task.request
            task.heartbeat(progress="t")
        finally:
            task.pop_request()

    try:
        task.heartbeat(progress="m")
        t = threading.Thread(target=other_thread)
        t.start()
        t.join(10)
        assert seen == {"request before": None, "request": True}
        assert [(s["id"], s["fence"], s["progress"]) for s in sent(app)] == [
            ("main", 1, '"m"'), ("thread", 4, '"t"')]
        assert task._request_top() is task.request
    finally:
        task.pop_request()
    assert task._request_top() is None


def test_the_fast_request_lookup_is_celerys_request(app):
    """heartbeat()'s hot path reads Celery's request stack directly (``Task.request``
    costs ~0.7 us); with the installed Celery it must be that fast reader, and agree."""
    task = app.tasks["hb.loop"]
    top = task_module._request_getter(task.request_stack)
    assert top.__name__ == "top"  # not the stack.top fallback
    assert top() is None
    task.push_request(id="x")
    try:
        assert top() is task.request
        task.push_request(id="y")
        assert top() is task.request
        assert top().id == "y"
        task.pop_request()
        assert top().id == "x"
    finally:
        task.pop_request()
    assert top() is None
    other = task_module._request_getter(SimpleNamespace(top="the top"))
    assert other() == "the top"


def test_a_throttled_call_raises_when_the_worker_shuts_down(app, clock, monkeypatch):
    task = running(app)
    keep_going = running(app, "hb.keep_going", task_id="t2")
    try:
        task.heartbeat(progress=1)
        keep_going.heartbeat(progress=1)
        monkeypatch.setattr(task_module.shutdown, "draining", lambda: True)
        with pytest.raises(WorkerShuttingDown):
            task.heartbeat(progress=2)
        keep_going.heartbeat(progress=2)  # on_shutdown=continue: throttled as usual
        assert task._pending_checkpoint() == {}  # the interrupted call kept nothing
        assert keep_going._pending_checkpoint() == {"progress": "2"}
    finally:
        keep_going.pop_request()
        task.pop_request()


def test_not_delivered_keeps_the_values_for_the_next_heartbeat(app, clock):
    task = running(app)
    store = _store(app)
    try:
        store.outage = True
        task.heartbeat(progress=1, checkpoint=1)
        task.heartbeat(progress=2)  # throttled after the attempt
        store.outage = False
        clock.now += HEARTBEAT_MIN_GAP_S
        task.heartbeat()
        assert [(s["progress"], s["ckpt"]) for s in sent(app)] == [("1", "1"), ("2", "1")]
    finally:
        task.pop_request()


def test_superseded_and_cancelled_are_raised_at_the_heartbeat_sent(app, clock):
    task = running(app)
    store = _store(app)
    try:
        store.cancel("t1", "by test")
        with pytest.raises(TaskCancelled):
            task.heartbeat(progress=1)
        task.heartbeat(progress=2)  # throttled: no round trip, no exception
        store.step("t1", TaskState.STALLED, sources=(TaskState.STARTED,), reason="stalled")
        clock.now += HEARTBEAT_MIN_GAP_S
        with pytest.raises(AttemptSuperseded, match="the task is stalled"):
            task.heartbeat()
        assert json.loads(sent(app)[1]["progress"]) == 2
    finally:
        task.pop_request()
