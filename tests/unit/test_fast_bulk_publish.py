"""A group's publish as one bulk publish, on the in-memory store and a fake producer (no
Redis, no broker): the members' ``submitted`` steps go to the store a batch at a time
(``submit_many``), and every member's message reaches the producer only once its record
exists, stamped as a single publish stamps it; a refused step, a failed batch write and a
message whose publish raises are handled as for a single publish (see
``jobbers_celery.lifecycle.bulk``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Self

import pytest
from celery import Celery, chord, group
from kombu.exceptions import BatchPublishError  # type: ignore[attr-defined]

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle.bulk import PublishBatch
from jobbers_celery.store import SentSteps, Submission
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory
from jobbers_celery.worker.bulk import BufferingProducer

S = TaskState


class CountingStore(InMemoryStore):
    """The in-memory store, counting its single and batched submits."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.singles = 0
        self.fail_batches = False

    def submit_many(self, items: Sequence[Submission]) -> SentSteps:
        if self.fail_batches:
            raise ConnectionError("the store is away")
        self.batches.append(len(items))
        return super().submit_many(items)

    def submit(self, task_id: str, **kw: Any) -> Any:
        if not self.batches or kw.get("reason") != "published":
            self.singles += 1
        return super().submit(task_id, **kw)


class FakeConnection:
    def _reraise_as_library_errors(self) -> Any:
        return contextlib.nullcontext()


class FakeProducer:
    """Stands for kombu's Producer: each publish is checked against the store, in order."""

    def __init__(self, store: InMemoryStore, fail_at: str | None = None) -> None:
        self.store = store
        self.fail_at = fail_at
        self.sent: list[dict[str, Any]] = []  # headers of each message, in order
        self.recorded_first: list[bool] = []
        self.connection = FakeConnection()

    def publish(self, body: Any, **kwargs: Any) -> None:
        headers = kwargs["headers"]
        if headers["id"] == self.fail_at:
            raise OSError("the broker refused it")
        record = self.store.get(headers["id"])
        self.recorded_first.append(record is not None)
        if self.buffer is not None:
            self.buffer.append(dict(headers))
        else:
            self.sent.append(dict(headers))

    buffer: list[dict[str, Any]] | None = None
    fail_flushes = 0  # the next flushes that raise kombu's BatchPublishError
    flushes = 0

    def batch(self, max_size: int = 1000) -> Any:
        """kombu's ``Producer.batch`` on a Redis broker: publishes buffered, written at
        ``flush`` and at a clean exit, discarded at an exit by an error."""
        producer = self

        class Batch:
            def __enter__(self) -> Self:
                producer.buffer = []
                return self

            def flush(self) -> None:
                buffered, producer.buffer = producer.buffer or [], []
                producer.flushes += 1
                if producer.fail_flushes:
                    producer.fail_flushes -= 1
                    raise BatchPublishError("Redis publish batch failed; delivery is uncertain")
                producer.sent += buffered

            def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
                try:
                    if kind is None:
                        self.flush()
                finally:
                    producer.buffer = None

        return Batch()


@pytest.fixture
def app() -> Celery:
    app = Celery("fast_bulk", broker="memory://")
    app.conf.jobbers_publish_batch = 50
    return app


@pytest.fixture
def store(app: Celery) -> CountingStore:
    store = CountingStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    return store


def _task(app: Celery) -> Any:
    @app.task(base=JobbersTask, name="bulk.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return add


def test_a_group_records_its_members_a_batch_at_a_time_before_their_messages(
        app: Celery, store: CountingStore) -> None:
    add = _task(app)
    producer = FakeProducer(store)
    result = group(add.s(i, i) for i in range(120)).apply_async(producer=producer)
    assert len(result.results) == 120
    assert store.batches == [50, 50, 20]  # 3 store calls for 120 members, not 120
    assert len(producer.sent) == 120
    assert all(producer.recorded_first)  # each message after its record existed
    assert [h["id"] for h in producer.sent] == [r.id for r in result.results]  # in order
    for headers in producer.sent:
        record = store.get(headers["id"])
        assert record is not None
        assert record.state is S.SUBMITTED
        assert record.group_id == result.id
        # stamped as a single publish stamps it
        assert headers[pl.HEADER_EPOCH] == store.epoch(headers["id"])
        assert headers[pl.HEADER_PUBLISHED_AT] == headers[pl.HEADER_ENQUEUED_AT]


def test_a_batched_record_is_the_record_a_single_publish_makes(
        app: Celery, store: CountingStore) -> None:
    add = _task(app)
    single = add.apply_async((1, 1), producer=FakeProducer(store))
    batched = group([add.s(1, 1)] * 3).apply_async(producer=FakeProducer(store)).results[0]
    one, other = store.get(single.id), store.get(batched.id)
    assert one is not None
    assert other is not None
    assert (one.state, one.name, one.queue, one.attempt) == (other.state, other.name,
                                                             other.queue, other.attempt)
    assert [t.reason for t in store.history(single.id)] == \
        [t.reason for t in store.history(batched.id)]


def test_a_refused_member_is_published_as_a_refused_single_publish_is(
        app: Celery, store: CountingStore) -> None:
    add = _task(app)
    taken = add.apply_async((0, 0), producer=FakeProducer(store))  # its record exists
    producer = FakeProducer(store)
    sigs = [add.s(i, i) for i in range(5)]
    sigs[2] = add.s(9, 9).set(task_id=taken.id)  # a duplicate id: its step is refused
    group(sigs).apply_async(producer=producer)
    assert [h["id"] for h in producer.sent][2] == taken.id
    refused = producer.sent[2]
    assert pl.HEADER_EPOCH not in refused
    assert pl.HEADER_PUBLISHED_AT in refused
    assert all(pl.HEADER_EPOCH in h for i, h in enumerate(producer.sent) if i != 2)
    record = store.get(taken.id)
    assert record is not None
    assert record.state is S.SUBMITTED  # the first one's, unchanged


def test_a_failed_batch_write_lets_the_messages_go_unrecorded(
        app: Celery, store: CountingStore, caplog: pytest.LogCaptureFixture) -> None:
    add = _task(app)
    store.fail_batches = True
    producer = FakeProducer(store)
    group(add.s(i, i) for i in range(60)).apply_async(producer=producer)
    assert len(producer.sent) == 60  # nothing lost: the worker records each at its start
    assert not any(producer.recorded_first)
    assert all(pl.HEADER_EPOCH not in h for h in producer.sent)
    assert all(h[pl.HEADER_TASK] == "bulk.add" for h in producer.sent)
    assert "could not record the publish of 50 of 50 member(s)" in caplog.text


def test_a_message_that_cannot_be_published_stops_the_group_and_ends_the_records_held(
        app: Celery, store: CountingStore) -> None:
    add = _task(app)
    sigs = [add.s(i, i).set(task_id=f"m{i}") for i in range(30)]
    producer = FakeProducer(store, fail_at="m10")
    with pytest.raises(OSError, match="refused"):
        group(sigs).apply_async(producer=producer)
    assert [h["id"] for h in producer.sent] == [f"m{i}" for i in range(10)]
    for i in range(10):
        record = store.get(f"m{i}")
        assert record is not None
        assert record.state is S.SUBMITTED
    for i in range(10, 30):  # recorded in the batch, never sent: ended at once
        record = store.get(f"m{i}")
        assert record is not None, (i, record)
        assert record.state is S.DROPPED, (i, record)


@contextlib.contextmanager
def default_producer(app: Celery, producer: FakeProducer) -> Iterator[None]:
    """``producer`` is what the app acquires when a publish names none."""
    original = app.producer_or_acquire

    def acquire(p: Any = None) -> Any:
        return original(p if p is not None else producer)

    app.producer_or_acquire = acquire  # type: ignore[method-assign]
    try:
        yield
    finally:
        app.producer_or_acquire = original  # type: ignore[method-assign]


def test_a_member_with_a_producer_of_its_own_is_recorded_before_its_message(
        app: Celery, store: CountingStore) -> None:
    """A chain in a group publishes its first task through a producer of its own: that
    publish is not held by the batch (its message goes at once), so its step is not either."""
    add = _task(app)
    producer, own = FakeProducer(store), FakeProducer(store)
    with default_producer(app, own):
        group([add.s(1, 1), add.s(2, 2) | add.s(3), add.s(4, 4)]).apply_async(
            producer=producer)
    assert len(producer.sent) == 2
    assert len(own.sent) == 1
    assert all(producer.recorded_first)
    assert all(own.recorded_first)


def test_a_chord_header_is_batched(app: Celery, store: CountingStore) -> None:
    add = _task(app)

    @app.task(base=JobbersTask, name="bulk.total", shared=False)
    def total(values: list[int]) -> int:
        return sum(values)

    app.conf.result_backend = "cache+memory://"
    producer = FakeProducer(store)
    with default_producer(app, producer):
        chord((add.s(i, i) for i in range(70)), total.s()).apply_async()
    assert store.batches == [50, 20]
    assert len(producer.sent) == 70
    assert all(producer.recorded_first)


def test_batching_off_publishes_each_member_with_its_own_step() -> None:
    app = Celery("fast_bulk_off", broker="memory://")
    app.conf.jobbers_publish_batch = 0
    store = CountingStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    add = _task(app)
    producer = FakeProducer(store)
    group(add.s(i, i) for i in range(10)).apply_async(producer=producer)
    assert store.batches == []
    assert len(producer.sent) == 10
    assert all(producer.recorded_first)


def test_the_producer_stands_for_the_real_one() -> None:
    class Real:
        connection = "conn"

    proxy = BufferingProducer(Real(), None)  # type: ignore[arg-type]
    assert proxy.connection == "conn"


def test_an_app_without_jobbers_runs_celerys_group_unchanged() -> None:
    app = Celery("fast_bulk_plain", broker="memory://")
    assert Jobbers.find(app) is None

    @app.task(name="bulk.plain", shared=False)
    def plain(x: int) -> int:
        return x

    sent: list[str] = []

    class Producer:
        connection = FakeConnection()

        def publish(self, body: Any, **kwargs: Any) -> None:
            sent.append(kwargs["headers"]["id"])

    result = group(plain.s(i) for i in range(5)).apply_async(producer=Producer())
    assert sent == [r.id for r in result.results]


def test_messages_without_records_are_not_held_to_the_end() -> None:
    """A group of plain tasks in an app with jobbers records nothing: its messages still go
    a batch at a time, not all at the end."""
    sent: list[int] = []
    batch = PublishBatch(lambda messages: sent.extend(body for body, _ in messages), 50)
    for i in range(100):
        batch.hold(i, {"headers": {"id": str(i)}})
    assert sent == list(range(50))  # the first batch out once the second is cut
    batch.close()
    assert sent == list(range(100))


def test_a_chunks_message_keeps_celerys_repr_unless_something_in_it_is_secret() -> None:
    """The argsrepr/kwargsrepr of a message whose arguments hold tuples (a ``chunks``
    message's pairs): shown whole and unchanged, Celery's own repr is kept (not made again);
    a secret anywhere in them is still redacted."""
    from celery.utils.saferepr import saferepr

    from jobbers_celery.core.redaction import REDACTED, redactor
    from jobbers_celery.worker.taskrepr import redact_headers

    app = Celery("fast_bulk_repr", set_as_current=False)
    redact = redactor()
    clean = {"task": {"task": "t.add", "args": (), "kwargs": {}},
             "it": [(1, 2), (3, 4)]}
    given = saferepr(clean)
    headers = {"argsrepr": "()", "kwargsrepr": given}
    redact_headers(app, None, headers, ((), clean, {}), redact)
    assert headers["kwargsrepr"] is given or headers["kwargsrepr"] == given

    secret = {"task": {"task": "t.login", "args": (), "kwargs": {}},
              "it": [("postgres://u:pw-1234@h/db", 1)], "password": "hunter2"}
    given = saferepr(secret)
    assert "hunter2" in given
    assert "pw-1234" in given
    headers = {"argsrepr": "()", "kwargsrepr": given}
    redact_headers(app, None, headers, ((), secret, {}), redact)
    assert "hunter2" not in headers["kwargsrepr"]
    assert "pw-1234" not in headers["kwargsrepr"]
    assert REDACTED in headers["kwargsrepr"]


def test_big_members_are_cut_by_their_bytes_so_the_last_batch_stays_small() -> None:
    """``chunks`` messages each hold their whole chunk (and so does each one's payload): a
    batch is cut once its payloads reach ``CUT_BYTES``, however few members it has, so that
    the store writes one batch while the next is built (only the last batch's write is not
    hidden); every message still goes after its record."""
    from jobbers_celery.lifecycle.bulk import CUT_BYTES

    app = Celery("fast_bulk_bytes", broker="memory://")
    app.conf.jobbers_publish_batch = 200
    store = CountingStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    add = _task(app)
    producer = FakeProducer(store)
    add.chunks(zip(range(10_000), range(10_000), strict=True), 100).group().apply_async(
        producer=producer)
    assert len(producer.sent) == 100
    assert all(producer.recorded_first)
    assert sum(store.batches) == 100
    sizes = [len(store.get_raw(h["id"])["msg"]) for h in producer.sent]
    assert 1000 < sizes[0] < CUT_BYTES
    assert len(store.batches) > 1, store.batches  # ~1.8 KB each: cut after ~70, not at 200
    at = 0
    for n in store.batches[:-1]:
        held = sizes[at:at + n]
        assert sum(held) >= CUT_BYTES > sum(held[:-1])  # cut at the member that reached it
        at += n


def test_small_members_are_still_cut_by_count(app: Celery, store: CountingStore) -> None:
    add = _task(app)
    group(add.s(i, i) for i in range(120)).apply_async(producer=FakeProducer(store))
    assert store.batches == [50, 50, 20]


def test_each_cuts_messages_go_in_one_kombu_batch(app: Celery, store: CountingStore) -> None:
    """On a Redis broker kombu writes a batch's messages in one pipelined call (a round trip
    each in Celery's own loop); still only after their records were written."""
    add = _task(app)
    producer = FakeProducer(store)
    group(add.s(i, i) for i in range(120)).apply_async(producer=producer)
    assert len(producer.sent) == 120
    assert all(producer.recorded_first)
    assert producer.flushes == 3  # cuts of 50, 50 and 20


def test_a_batch_whose_write_failed_is_published_again_one_at_a_time(
        app: Celery, store: CountingStore, caplog: pytest.LogCaptureFixture) -> None:
    """kombu cannot tell which messages of a failed batch write went: each is published
    again (Celery's publish retry does the same for a message whose reply was lost)."""
    add = _task(app)
    producer = FakeProducer(store)
    producer.fail_flushes = 1
    sigs = [add.s(i, i).set(task_id=f"m{i}") for i in range(60)]
    group(sigs).apply_async(producer=producer)
    assert [h["id"] for h in producer.sent] == [f"m{i}" for i in range(60)]
    assert "delivery is uncertain): publishing them one at a time" in caplog.text
    assert all(store.get(f"m{i}").state is S.SUBMITTED for i in range(60))  # type: ignore[union-attr]


def test_a_message_kombu_cannot_publish_in_a_batch_lets_those_before_it_go(
        app: Celery, store: CountingStore) -> None:
    add = _task(app)
    sigs = [add.s(i, i).set(task_id=f"m{i}") for i in range(80)]
    producer = FakeProducer(store, fail_at="m62")
    with pytest.raises(OSError, match="refused"):
        group(sigs).apply_async(producer=producer)
    assert [h["id"] for h in producer.sent] == [f"m{i}" for i in range(62)]
    assert all(store.get(f"m{i}").state is S.SUBMITTED for i in range(62))  # type: ignore[union-attr]
    assert all(store.get(f"m{i}").state is S.DROPPED for i in range(62, 80))  # type: ignore[union-attr]
