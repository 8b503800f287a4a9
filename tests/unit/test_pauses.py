"""Pauses on the in-memory store: the hold and its release (the same rules as hold.lua and
release.lua, whose real-Redis runs are tests/integration/test_pauses.py), the worker's
decision for a message, the names a pause takes (property tests), the CLI's bad input,
and the age of a Redis-broker message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.cli import workers as cli_workers
from jobbers_celery.core.pauses import (
    HELD_REASON,
    MAX_NAME,
    PauseError,
    PauseKind,
    field_of,
    held_reason,
    parse_field,
    validate_name,
)
from jobbers_celery.lifecycle import fleet
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory
from jobbers_celery.worker import pause as worker_pause

S = TaskState


@pytest.fixture
def world() -> Iterator[tuple[Any, Any, Any]]:
    app = Celery("pauses", broker="memory://", set_as_current=False)
    store = InMemoryStore()
    jobbers = in_memory(app, store, InMemoryDeadLetterSink())

    @app.task(base=JobbersTask, bind=True, name="t.job", shared=False)
    def job(self: JobbersTask, x: int) -> int:
        return x

    yield jobbers, store, job
    worker_pause.PAUSED.names = frozenset()
    worker_pause.PAUSED.here.clear()


def _hold(store: InMemoryStore, task_id: str) -> Any:
    return store.hold(task_id, "t.job", worker="w1", reason=held_reason("t.job"))


def test_hold_only_while_paused_then_resume_publishes_each_once(world):
    jobbers, store, job = world
    ids = [job.delay(i).id for i in range(3)]
    assert not _hold(store, ids[0]).applied  # not paused: refused, the task runs
    assert _hold(store, ids[0]).why == "not_paused"
    out = jobbers.pause(name="t.job", by="test")
    assert out.changed
    assert out.workers == []
    assert not jobbers.pause(name="t.job").changed
    for i in ids:
        res = _hold(store, i)
        assert res.applied
        assert res.state is S.SCHEDULED
    for i in ids:
        rec = jobbers.get(i)
        assert rec.state is S.SCHEDULED
        assert rec.run_at is None
        assert rec.retry_attempt == 0
        assert jobbers.history(i)[-1].reason.startswith(HELD_REASON)
    assert jobbers.held_count("t.job") == 3
    store.advance(10**6)  # never due: no scheduler publishes a held task
    assert store.due()[0] == []
    done = jobbers.resume(name="t.job", by="test")
    assert done.changed
    assert done.released == 3
    for i in ids:
        assert jobbers.get(i).state is S.SUBMITTED
        assert jobbers.history(i)[-1].reason.startswith("resumed")
    assert jobbers.held_count("t.job") == 0
    assert jobbers.resume(name="t.job").released == 0  # nothing twice


def test_release_waits_while_paused_again_and_forgets_cancelled(world):
    jobbers, store, job = world
    jobbers.pause(name="t.job")
    a, b = job.delay(1).id, job.delay(2).id
    assert _hold(store, a).applied
    assert _hold(store, b).applied
    assert store.release("t.job", [a, b], lease_ms=1000, worker=None, reason="r") is None
    assert jobbers.cancel(a)
    assert jobbers.resume(name="t.job").released == 1  # b; a is only forgotten
    assert jobbers.get(a).state is S.CANCELLED
    assert jobbers.get(b).state is S.SUBMITTED
    assert jobbers.held_count("t.job") == 0


def test_pause_target_and_listing(world):
    jobbers, _, _ = world
    with pytest.raises(PauseError):
        jobbers.pause()
    with pytest.raises(PauseError):
        jobbers.pause(name="a", queue="b")
    with pytest.raises(PauseError):
        jobbers.pause(queue="bad\nname")
    jobbers.pause(queue="reports", by="ann")
    jobbers.pause(name="t.job", by="bob")
    got = [(p.kind, p.target, p.by) for p in jobbers.pauses()]
    assert sorted(got) == [(PauseKind.QUEUE, "reports", "ann"), (PauseKind.TASK, "t.job", "bob")]


class _Request(SimpleNamespace):
    __hash__ = object.__hash__  # task_ready() drops it from a weak set
    acked = False
    requeued: bool | None = None

    def acknowledge(self) -> None:
        self.acked = True

    def reject(self, requeue: bool = False) -> None:
        self.requeued = requeue


def _request(job: Any, task_id: str, queue: str = "celery") -> _Request:
    return _Request(name=job.name, id=task_id, hostname="w1@h", task=job,
                    delivery_info={"routing_key": queue}, _already_revoked=False)


def test_worker_holds_a_paused_name_and_runs_it_when_the_store_says_resumed(world):
    jobbers, store, job = world
    task_id = job.delay(1).id
    worker_pause.PAUSED.names = frozenset({"t.job"})  # the worker's view: paused
    req = _request(job, task_id)
    assert not worker_pause.hold_if_paused(req)  # the store says not paused: it runs
    assert "t.job" not in worker_pause.PAUSED.names
    assert not req.acked
    jobbers.pause(name="t.job")
    worker_pause.PAUSED.refresh(store)
    req = _request(job, task_id)
    assert worker_pause.hold_if_paused(req)
    assert req.acked
    assert req._already_revoked
    assert jobbers.get(task_id).state is S.SCHEDULED


def test_worker_gives_back_only_a_message_whose_queue_it_knows(world):
    _, _, job = world
    worker_pause.PAUSED.here.add("reports")
    req = _request(job, "x", queue="reports")  # the routing key only: not its queue
    assert not worker_pause.hold_if_paused(req)  # unknown: it runs, not re-routed
    assert (req.requeued, req.acked) == (None, False)
    put: list[tuple[str, Any]] = []
    raw = {"body": "b", "properties": {"delivery_tag": "t1", "delivery_info": {
        "exchange": "jobs", "routing_key": "daily", worker_pause.SOURCE: "reports"}}}
    req.message = SimpleNamespace(delivery_info=raw["properties"]["delivery_info"],
                                  _raw=raw, channel=SimpleNamespace(
                                      _put=lambda q, m: put.append((q, m))))
    assert worker_pause.hold_if_paused(req)
    assert (req.requeued, req.acked) == (None, True)  # a copy put, the fetched one acked
    ((queue, copy),) = put
    assert queue == "reports"
    assert copy["properties"]["delivery_tag"] != "t1"
    assert copy["properties"]["delivery_info"] == {"exchange": "jobs", "routing_key": "daily"}


def test_a_virtual_transport_gives_back_to_the_one_queue_not_every_bound_one():
    """Queues Q and S are bound to exchange E by the same key: kombu's reject with requeue
    restores a message taken from Q into both (S gets a copy); stamped by SourceStep and
    put back, Q gets it back alone."""
    from kombu import Connection, Consumer, Exchange, Producer, Queue

    ex = Exchange("E", type="direct")
    q, s = Queue("Q", ex, routing_key="daily"), Queue("S", ex, routing_key="daily")

    def depth(conn: Any, queue: Any) -> int:
        return int(queue(conn.default_channel).queue_declare(passive=True).message_count)

    for give_back in ("reject", "put"):
        with Connection("memory://") as conn:
            for queue in (q, s):
                queue(conn.default_channel).declare()
                queue(conn.default_channel).purge()
            Producer(conn.default_channel).publish({"x": 1}, exchange=ex,
                                                    routing_key="daily", declare=[q, s])
            worker_pause.SourceStep(SimpleNamespace()).start(SimpleNamespace(connection=conn))
            got: list[Any] = []
            with Consumer(conn.default_channel, [q], callbacks=[
                    lambda _body, message, got=got: got.append(message)]):
                conn.drain_events(timeout=2)
            (message,) = got
            assert message.delivery_info[worker_pause.SOURCE] == "Q"
            if give_back == "reject":
                message.reject(requeue=True)
                assert (depth(conn, q), depth(conn, s)) == (1, 2)  # the duplicate
            else:
                assert worker_pause._put_back(message, "Q")
                message.ack()
                assert (depth(conn, q), depth(conn, s)) == (1, 1)


@given(st.text(max_size=MAX_NAME + 20))
def test_a_name_is_taken_whole_or_refused(name):
    try:
        kind, got = validate_name("task", name)
    except PauseError as exc:
        refused = str(exc)
    else:
        refused = ""
    if refused:
        assert len(refused) < 200  # never quotes the name back
        return
    assert got == name
    assert kind is PauseKind.TASK
    assert 0 < len(name) <= MAX_NAME
    assert name.isprintable()
    assert name == name.strip()
    assert parse_field(field_of(kind, name)) == (kind, name)


@given(st.text(max_size=300))
def test_a_stored_field_parses_or_is_skipped(field):
    got = parse_field(field)
    assert got is None or field_of(*got) == field


def test_unknown_kind_refused():
    with pytest.raises(PauseError):
        validate_name("worker", "x")


@pytest.mark.parametrize("args", [[], ["--task", "a", "--queue", "b"], ["--task", ""],
                                  ["--queue", "x" * (MAX_NAME + 1)], ["--task", "a\x1b[2J"]])
@pytest.mark.parametrize("command", [cli_workers.pause, cli_workers.resume])
def test_cli_bad_input_exits_2(command, args):
    got = CliRunner().invoke(command, args, obj=SimpleNamespace(app=None))
    assert got.exit_code == 2, got.output
    assert "\x1b" not in got.output


def _envelope(headers: dict[str, Any]) -> str:
    return json.dumps({"body": "e30=", "headers": headers, "properties": {}})


def test_message_age_from_header_else_record():
    now = 1_000_000
    assert fleet._message_age(_envelope({"id": "a", "jobbers_published_at": now - 2500}),
                              now, lambda _: None) == (2.5, "a")
    rec = SimpleNamespace(submitted_at=SimpleNamespace(timestamp=lambda: 990.0))
    assert fleet._message_age(_envelope({"id": "b"}), now, lambda _: rec) == (10.0, "b")
    assert fleet._message_age(_envelope({"id": "c"}), now, lambda _: None) is None
    assert fleet._message_age("not json", now, lambda _: None) is None
    assert fleet._message_age(json.dumps([1]), now, lambda _: None) is None


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_message_age_never_raises(raw):
    got = fleet._message_age(raw, 0, lambda _: None)
    assert got is None or got[0] >= 0


def test_pool_name_and_queue_names():
    assert fleet._pool_name("celery.concurrency.prefork:TaskPool") == "prefork"
    assert fleet._pool_name(None) is None
    app = Celery("q", broker="memory://", set_as_current=False)
    assert fleet.queue_names(app, ["b"], ["a"]) == ["a", "b", "celery"]


def test_age_from_records_when_the_broker_cannot_show_a_message(world):
    _, store, job = world
    first = job.apply_async((1,), queue="reports").id
    store.advance(5)
    job.apply_async((2,), queue="reports")
    got = store.oldest_submitted(["reports", "other"])
    assert set(got) == {"reports"}
    assert got["reports"][1] == first
    now = store.now_ms()
    infos = fleet._with_record_ages(
        [fleet.QueueInfo("reports", 2), fleet.QueueInfo("other", 1),
         fleet.QueueInfo("empty", 0)], now, store.oldest_submitted)
    reports, other, empty = infos
    assert reports.oldest_task_id == first
    assert reports.oldest_age_s is not None
    assert reports.oldest_age_s >= 5
    assert "records" in reports.note
    assert other.oldest_age_s is None
    assert "not known" in other.note
    assert empty.note == ""


# ------------------------------------------------------ the queue a message came from
class _Consumer:
    """A worker consumer's task consumer as kombu keeps it: queues and their tags."""

    def __init__(self, *queues: Any) -> None:
        self.task_consumer = SimpleNamespace(
            queues=list(queues), _active_tags={q.name: f"tag-{q.name}" for q in queues})

    def cancel_task_queue(self, name: str) -> None:
        tc = self.task_consumer
        tc.queues = [q for q in tc.queues if q.name != name]
        tc._active_tags.pop(name, None)

    def add_task_queue(self, name: str) -> None:
        from kombu import Queue

        self.task_consumer.queues.append(Queue(name))
        self.task_consumer._active_tags[name] = f"tag2-{name}"


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Consumer]:
    """Queue ``reports`` bound to exchange ``jobs`` by the key ``daily``, besides a queue
    named ``daily``, a topic and a fanout queue."""
    from kombu import Exchange, Queue

    consumer = _Consumer(
        Queue("reports", Exchange("jobs", "direct"), routing_key="daily"),
        Queue("daily", Exchange("celery", "direct"), routing_key="daily"),  # as -Q makes it
        Queue("events", Exchange("bus", "topic"), routing_key="order.*.done"),
        Queue("copies", Exchange("all", "fanout")))
    monkeypatch.setattr(worker_pause, "_consumer", consumer)
    paused = worker_pause.PAUSED
    yield consumer
    paused.queues, paused.tags = frozenset(), {}
    paused.here.clear()


def _pause(consumer: _Consumer, *queues: str) -> None:
    worker_pause.PAUSED.queues = frozenset(queues)
    worker_pause.PAUSED.apply(consumer)


def test_the_queue_is_the_consumer_tags_even_after_its_consumer_was_cancelled(world, bound):
    _, _, job = world
    _pause(bound, "daily")  # the queue named like the key: not where this came from
    req = _request(job, "x", queue="daily")
    req.message = SimpleNamespace(delivery_info={
        "consumer_tag": "tag-reports", "exchange": "jobs", "routing_key": "daily"})
    assert not worker_pause.hold_if_paused(req)
    _pause(bound, "reports")  # fetched before the cancel: its tag is kept
    assert worker_pause.hold_if_paused(req)
    assert req.requeued is True
    _pause(bound)  # resumed: consumed again under a new tag
    assert worker_pause.PAUSED.tags == {}
    assert not worker_pause.hold_if_paused(_request(job, "y", queue="daily"))


