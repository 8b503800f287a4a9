"""A publish's arguments encoded once (``jobbers_celery.lifecycle.bodyjson``): the message
body kombu sends and the payload the record keeps come from one JSON encoding, byte for byte
what each was before (kombu's json serializer for the body, the record's own encoding for
the payload), and the record is still written before its message reaches the producer.

Real kombu on the in-process ``memory://`` transport where the message's bytes matter; a
fake producer (no broker) where the order of record and message does."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, group, signals
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import serialization
from kombu.exceptions import EncodeError

from jobbers_celery import JobbersTask, TaskState
from jobbers_celery.core.codec import PayloadCodec, new_key
from jobbers_celery.deadletter.payloadjson import loads
from jobbers_celery.lifecycle import bodyjson
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory

S = TaskState


class Counted:
    """A value whose JSON encoding is counted (kombu's encoder calls ``__json__``)."""

    calls = 0

    def __init__(self, value: int) -> None:
        self.value = value

    def __json__(self) -> int:
        Counted.calls += 1
        return self.value


class FakeConnection:
    def _reraise_as_library_errors(self) -> Any:
        return contextlib.nullcontext()


class FakeProducer:
    """Stands for kombu's Producer: keeps what each publish was given, and whether the
    message's record existed then."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store
        self.connection = FakeConnection()
        self.published: list[tuple[Any, dict[str, Any], bool]] = []

    def publish(self, body: Any, **kwargs: Any) -> None:
        recorded = self.store.get(kwargs["headers"]["id"]) is not None
        self.published.append((body, kwargs, recorded))


@contextlib.contextmanager
def default_producer(app: Celery, producer: Any) -> Iterator[None]:
    """``producer`` is what the app acquires when a publish names none."""
    original = app.producer_or_acquire

    def acquire(p: Any = None) -> Any:
        return original(p if p is not None else producer)

    app.producer_or_acquire = acquire  # type: ignore[method-assign]
    try:
        yield
    finally:
        app.producer_or_acquire = original  # type: ignore[method-assign]


@pytest.fixture
def app() -> Celery:
    app = Celery("shared_body", broker="memory://", set_as_current=False)
    app.conf.jobbers_publish_batch = 50
    return app


@pytest.fixture
def store(app: Celery) -> InMemoryStore:
    store = InMemoryStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    return store


def _task(app: Celery) -> Any:
    @app.task(base=JobbersTask, name="shared.add", shared=False)
    def add(*args: Any, **kwargs: Any) -> int:
        return 0

    return add


def _consume(app: Celery, queue: str) -> Any:
    with app.connection_for_read() as conn:
        q = conn.SimpleQueue(queue)
        try:
            message = q.get(timeout=2)
            message.ack()
            return message
        finally:
            q.close()


# ------------------------------------------------------------------ the encoding itself
_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
            | st.text() | st.datetimes() | st.uuids() | st.decimals(allow_nan=False)
            | st.dates())
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.tuples(inner, inner)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                       max_leaves=20)
_args = st.lists(_values, max_size=5) | st.tuples(_values, _values)
_kwargs = st.dictionaries(st.text(max_size=10), _values, max_size=5)
_embed = st.fixed_dictionaries({"callbacks": st.none(), "errbacks": st.none(),
                                "chain": st.none(), "chord": st.none() | _kwargs})
_options = st.dictionaries(st.sampled_from(["queue", "headers", "root_id", "expires"]),
                           st.text(max_size=10) | _kwargs, max_size=3)


@settings(max_examples=300, deadline=None)
@given(args=_args, kwargs=_kwargs, embed=_embed, options=_options)
def test_the_shared_text_is_what_kombu_and_the_record_each_wrote(
        args: Any, kwargs: Any, embed: Any, options: Any) -> None:
    body = (args, kwargs, embed)
    shared = bodyjson.encode(body)
    assert shared is not None
    content_type, encoding, kombu_text = serialization.dumps(body, serializer="json")
    assert (content_type, encoding) == (bodyjson.CONTENT_TYPE, bodyjson.CONTENT_ENCODING)
    assert shared.text == kombu_text  # the broker gets the same bytes
    payload = {"args": list(args), "kwargs": dict(kwargs), "options": options}
    assert bodyjson.payload_text(shared, options, None) == \
        bodyjson.record_text(payload, None)  # the record keeps the same text


def test_with_payload_keys_the_shared_arguments_are_sealed_as_before() -> None:
    codec = PayloadCodec.of([new_key("k1")])
    body = ((1, "a", dt.datetime(2026, 1, 2, 3, 4, 5)), {"n": decimal.Decimal("1.5")},
            {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    shared = bodyjson.encode(body)
    assert shared is not None
    options = {"queue": "q"}
    text = bodyjson.payload_text(shared, options, codec)
    stored = loads(text)
    assert stored["args"] == []
    assert stored["options"] == options
    assert "1.5" not in text  # sealed
    opened = pl.open_arguments(stored["args"], stored["kwargs"], codec)
    alone = loads(bodyjson.record_text(
        {"args": list(body[0]), "kwargs": body[1], "options": options}, codec))
    assert opened == pl.open_arguments(alone["args"], alone["kwargs"], codec)
    assert opened == ([1, "a", dt.datetime(2026, 1, 2, 3, 4, 5)], {"n": decimal.Decimal("1.5")})


@pytest.mark.parametrize("body", [
    "a string", (1, 2), ((), {}, {}, {}), ({"a": 1}, {}, {}), ((), [("k", 1)], {}),
    ((), type("D", (dict,), {})(), {}),
])
def test_only_a_protocol_2_body_of_plain_containers_is_shared(body: Any) -> None:
    assert bodyjson.encode(body) is None


def test_another_serializer_or_a_given_content_type_is_not_shared() -> None:
    assert bodyjson.shares({"serializer": "json"})
    assert not bodyjson.shares({"serializer": "pickle"})
    assert not bodyjson.shares({"serializer": "msgpack"})
    assert not bodyjson.shares({})
    assert not bodyjson.shares({"serializer": "json", "content_type": "application/x"})


def test_a_json_serializer_registered_over_kombus_is_not_shared() -> None:
    serialization.register("json", lambda o: "{}", loads,
                           content_type="application/json", content_encoding="utf-8")
    try:
        assert not bodyjson.shares({"serializer": "json"})
    finally:
        serialization.register_json()
    assert bodyjson.shares({"serializer": "json"})


# ------------------------------------------------------------------ a publish through Celery
def test_a_publish_encodes_its_arguments_once_and_records_them_first(
        app: Celery, store: InMemoryStore) -> None:
    add = _task(app)
    producer = FakeProducer(store)
    Counted.calls = 0
    with default_producer(app, producer):
        result = add.apply_async((Counted(7), 2), {"k": Counted(8)})
    assert Counted.calls == 2  # each argument once: not once more for the record
    [(body, kwargs, recorded)] = producer.published
    assert recorded  # the record existed before its message reached the producer
    assert kwargs["content_type"] == "application/json"
    assert kwargs["content_encoding"] == "utf-8"
    assert isinstance(body, str)
    args_text, kwargs_text = "[7, 2]", '{"k": 8}'
    assert body.startswith(f"[{args_text}, {kwargs_text}, ")
    msg = store.get_raw(result.id)["msg"]
    assert msg.startswith(f'{{"args": {args_text}, "kwargs": {kwargs_text}, "options": ')
    assert loads(msg)["options"]["queue"] == "celery"
    headers = kwargs["headers"]  # stamped as before, once the step was written
    assert headers[pl.HEADER_EPOCH] == store.epoch(result.id)
    assert pl.HEADER_PUBLISHED_AT in headers


def test_a_group_member_shares_its_encoding_in_the_batch(
        app: Celery, store: InMemoryStore) -> None:
    add = _task(app)
    producer = FakeProducer(store)
    Counted.calls = 0
    result = group(add.s(Counted(i), i) for i in range(60)).apply_async(producer=producer)
    assert Counted.calls == 60
    assert len(producer.published) == 60
    for (body, kwargs, recorded), member in zip(producer.published, result.results,
                                                strict=True):
        assert recorded
        assert kwargs["content_type"] == "application/json"
        args_text = loads(body)[0]
        assert loads(store.get_raw(member.id)["msg"])["args"] == args_text


def test_the_real_broker_gets_the_body_celery_would_have_sent(
        app: Celery, store: InMemoryStore) -> None:
    add = _task(app)
    queue = f"shared-{uuid.uuid4().hex}"
    when = dt.datetime(2026, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    args = (1, "é\u2028", when, uuid.UUID(int=5), [1.5, None, True])
    kwargs = {"nested": {"a": [1, 2]}, "d": decimal.Decimal("2.50")}
    result = add.apply_async(args, kwargs, queue=queue)
    message = _consume(app, queue)
    assert message.content_type == "application/json"
    assert message.content_encoding == "utf-8"
    sent_args, sent_kwargs, embed = message.decode()
    assert sent_args == list(args)
    assert sent_kwargs == kwargs
    assert embed == {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    _, _, plain = serialization.dumps((args, kwargs, embed), serializer="json")
    assert message.body == plain.encode()  # byte for byte kombu's own encoding
    stored = loads(store.get_raw(result.id)["msg"])
    assert (stored["args"], stored["kwargs"]) == (list(args), kwargs)


def test_a_receiver_that_changes_the_body_after_jobbers_is_seen_by_both(
        app: Celery, store: InMemoryStore) -> None:
    """A ``before_task_publish`` receiver connected after jobbers' that adds a keyword
    argument in place: the message carries it (as with plain Celery), and so does the
    record, encoded from the body as it is sent."""
    add = _task(app)
    queue = f"shared-{uuid.uuid4().hex}"

    def inject(body: Any = None, **_: Any) -> None:
        body[1]["request_id"] = "r-1"

    signals.before_task_publish.connect(inject, weak=False)
    try:
        result = add.apply_async((1,), {}, queue=queue)
    finally:
        signals.before_task_publish.disconnect(inject)
    _, sent_kwargs, _ = _consume(app, queue).decode()
    assert sent_kwargs == {"request_id": "r-1"}
    assert loads(store.get_raw(result.id)["msg"])["kwargs"] == {"request_id": "r-1"}


def test_another_serializer_is_published_by_kombu_and_recorded_as_before(
        app: Celery, store: InMemoryStore) -> None:
    add = _task(app)
    producer = FakeProducer(store)
    with default_producer(app, producer):
        result = add.apply_async((1, 2), serializer="pickle")
    [(body, kwargs, recorded)] = producer.published
    assert recorded
    assert isinstance(body, tuple)  # kombu encodes it
    assert "content_type" not in kwargs
    assert loads(store.get_raw(result.id)["msg"])["args"] == [1, 2]


def test_an_argument_kombu_cannot_encode_still_fails_the_publish_and_ends_its_record(
        app: Celery, store: InMemoryStore) -> None:
    add = _task(app)
    with pytest.raises(EncodeError):
        add.apply_async((object(),), task_id="unencodable", queue=f"shared-{uuid.uuid4().hex}")
    record = store.get("unencodable")
    assert record is not None
    assert record.state is S.DROPPED  # never sent: ended at once
    assert loads(store.get_raw("unencodable")["msg"])["unserializable"] is True


def test_a_publish_through_a_connection_of_its_own_is_recorded_in_the_signal(
        app: Celery, store: InMemoryStore) -> None:
    """``connection=``: Celery makes its producer itself, which jobbers does not wrap; the
    step is written in the publish signal, with its own encoding, as before."""
    add = _task(app)
    queue = f"shared-{uuid.uuid4().hex}"
    with app.connection_for_write() as conn:
        result = add.apply_async((3, 4), connection=conn, queue=queue)
    message = _consume(app, queue)
    assert message.decode()[0] == [3, 4]
    record = store.get(result.id)
    assert record is not None
    assert record.state is S.SUBMITTED
    assert loads(store.get_raw(result.id)["msg"])["args"] == [3, 4]


def test_a_publish_retried_by_celery_is_recorded_once() -> None:
    """Celery retries a worker callback's publish by calling the producer again with the
    same body: the step went with the first call; the next ones only publish."""
    steps: list[str] = []
    sent: list[Any] = []
    body = ((1,), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    slot = bodyjson.open_slot()
    try:
        assert bodyjson.defer(bodyjson.Pending("t1", "n", body, {}, None, steps.append))
        for _ in range(2):
            bodyjson.publish(lambda b, k: sent.append(b), body, {"serializer": "json"})
    finally:
        bodyjson.close(slot, sent=True)
    assert steps == ['{"args": [1], "kwargs": {}, "options": {}}']
    assert sent == [bodyjson.encode(body).text, body]  # type: ignore[union-attr]


def test_a_step_whose_message_never_reached_the_producer_is_written_late_or_dropped(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="jobbers.lifecycle")  # whatever the root's is
    body = ((1,), {}, {})
    for sent, want in ((True, ['{"args": [1], "kwargs": {}, "options": {}}']), (False, [])):
        steps: list[str] = []
        slot = bodyjson.open_slot()
        bodyjson.defer(bodyjson.Pending("t1", "n", body, {}, None, steps.append))
        bodyjson.close(slot, sent=sent)
        assert steps == want
    assert "did not reach jobbers' producer" in caplog.text


def test_without_a_slot_nothing_is_deferred() -> None:
    assert not bodyjson.defer(bodyjson.Pending("t1", "n", ((), {}, {}), {}, None, print))


def test_a_step_that_fails_is_logged_and_the_message_still_goes(
        caplog: pytest.LogCaptureFixture) -> None:
    def fail(msg: str) -> None:
        raise ConnectionError("the store is away")

    sent: list[Any] = []
    body = ((1,), {}, {})
    slot = bodyjson.open_slot()
    try:
        bodyjson.defer(bodyjson.Pending("t1", "n", body, {}, None, fail))
        bodyjson.publish(lambda b, k: sent.append(b), body, {"serializer": "json"})
    finally:
        bodyjson.close(slot, sent=True)
    assert len(sent) == 1
    assert "could not record the publish of n[t1]" in caplog.text
