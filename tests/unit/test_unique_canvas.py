"""A unique task's duplicate inside a canvas, on the in-memory store and a fake producer (no
Redis, no broker): the duplicate is not sent, and its result is stored REVOKED at once, its
reason naming the holder, so that nothing waits for it for ever (a group's result, a chord's
callback, a chain's last link); a chord header member's request carries its chord, group
and index, so the backend counts its part. A lone duplicate publish stores nothing (its
caller gets the holder's result). See ``jobbers_celery.worker.bulk.revoke_duplicate``."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, chord, group
from celery import states as celery_states
from celery.exceptions import TaskRevokedError

from jobbers_celery import JobbersTask, Unique
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory
from jobbers_celery.worker import bulk as bulk_publish
from tests.unit.test_fast_bulk_publish import FakeProducer, default_producer


class Revokes:
    """Records the backend's ``mark_as_revoked`` calls, then lets the backend store them."""

    def __init__(self, app: Celery) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        backend: Any = app.backend
        original = backend.mark_as_revoked

        def mark(task_id: str, reason: str = "", request: Any = None, **kw: Any) -> None:
            self.calls.append((task_id, reason, request))
            original(task_id, reason, request=request, **kw)

        backend.mark_as_revoked = mark

    def ids(self) -> list[str]:
        return [task_id for task_id, _, _ in self.calls]


@pytest.fixture
def app() -> Celery:
    app = Celery("unique_canvas", broker="memory://", backend="cache+memory://")
    app.conf.jobbers_publish_batch = 50
    app.conf.task_serializer = "json"
    return app


@pytest.fixture
def producer(app: Celery) -> FakeProducer:
    store = InMemoryStore()
    in_memory(app, store, InMemoryDeadLetterSink())
    return FakeProducer(store)


def _tasks(app: Celery) -> tuple[Any, Any]:
    @app.task(base=JobbersTask, name="uc.once", unique=Unique(on=(0,)), shared=False)
    def once(key: str) -> str:
        return key

    @app.task(base=JobbersTask, name="uc.total", shared=False)
    def total(values: list[str]) -> int:
        return len(values)

    return once, total


def test_a_duplicate_member_of_a_group_is_revoked_naming_its_holder(
        app: Celery, producer: FakeProducer) -> None:
    once, _ = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("k")
        revokes = Revokes(app)
        result: Any = group(once.s("k"), once.s("free"), once.s("free")).apply_async()
    first, free, again = result.results
    assert [h["id"] for h in producer.sent] == [holder.id, free.id]
    assert revokes.ids() == [first.id, again.id]
    assert first.state == again.state == celery_states.REVOKED
    reason = str(first.result)
    assert holder.id in reason
    assert free.id in str(again.result)  # the group's own member holds that key
    assert revokes.calls[0][2].group == result.id
    assert revokes.calls[0][2].group_index == 0
    assert revokes.calls[1][2].group_index == 2
    assert not revokes.calls[0][2].chord


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_a_chord_header_member_carries_its_chord_to_the_backend(
        app: Celery, producer: FakeProducer, serializer: str) -> None:
    """The message's body is the text bodyjson encoded (json) or the arguments kombu
    encodes later (any other serializer): the chord is read from either."""
    app.conf.task_serializer = serializer
    app.conf.accept_content = ["json", "pickle"]
    once, total = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("c")
        revokes = Revokes(app)
        callback = total.s()
        chord([once.s("a"), once.s("c"), once.s("b")], callback).apply_async()
    assert len(revokes.calls) == 1
    task_id, reason, request = revokes.calls[0]
    assert holder.id in reason
    assert request.group_index == 1
    assert request.group
    assert request.chord["task"] == "uc.total"
    assert task_id not in [h["id"] for h in producer.sent]
    state: str = app.AsyncResult(task_id).state
    assert state == celery_states.REVOKED


def test_a_chain_whose_first_link_is_a_duplicate_has_its_links_revoked(
        app: Celery, producer: FakeProducer) -> None:
    once, total = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("x")
        revokes = Revokes(app)
        last = (once.s("x") | total.s() | total.s()).apply_async()
    assert [h["id"] for h in producer.sent] == [holder.id]
    assert last.state == celery_states.REVOKED
    assert last.parent is not None
    assert last.parent.state == celery_states.REVOKED
    assert len(revokes.calls) == 3  # the first link and both later ones
    assert all(holder.id in reason for _, reason, _ in revokes.calls)


def test_a_delayed_duplicate_member_is_revoked_too(app: Celery,
                                                   producer: FakeProducer) -> None:
    """A member with a countdown is recorded to wait in the store (worker/delays.py), not
    through the group's batch: refused there, it is REVOKED the same way."""
    once, _ = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("d")
        revokes = Revokes(app)
        result: Any = group(once.s("d").set(countdown=60), once.s("e")).apply_async()
    assert revokes.ids() == [result.results[0].id]
    assert holder.id in revokes.calls[0][1]
    assert revokes.calls[0][2].group == result.id


def test_a_chain_in_a_chord_header_counts_the_part_of_its_last_link(
        app: Celery, producer: FakeProducer) -> None:
    """The chain's first link publishes through a producer of its own (not the batch): its
    chain's last link, which carries the chord, is REVOKED with it."""
    once, total = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("h")
        revokes = Revokes(app)
        chord([once.s("h") | total.s(), once.s("other")], total.s()).apply_async()
    assert len(revokes.calls) == 2
    (_, _, head), (_, reason, tail) = revokes.calls
    assert not head.chord
    assert holder.id in reason
    assert tail.chord["task"] == "uc.total"
    assert (tail.group_index, bool(tail.group)) == (0, True)


def test_a_lone_duplicate_publish_stores_nothing(app: Celery,
                                                 producer: FakeProducer) -> None:
    once, _ = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("lone")
        revokes = Revokes(app)
        assert once.delay("lone").id == holder.id
    assert revokes.calls == []


def test_a_backend_error_is_logged_not_raised(app: Celery,
                                              caplog: pytest.LogCaptureFixture) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the backend is away")

    backend: Any = app.backend
    backend.mark_as_revoked = fail
    bulk_publish.revoke_duplicate(app, "t1", "uc.once", "h1", group_id="g")
    assert "could not be stored REVOKED" in caplog.text


def test_a_message_without_protocol_2_headers_is_left_alone(app: Celery) -> None:
    revokes = Revokes(app)
    bulk_publish._refused(app, ({"id": "t", "task": "uc.once"}, {"headers": {}}), "h")
    bulk_publish._refused(app, ("not json", {"headers": {"id": "t", "task": "uc.once"},
                                             "content_type": "application/json"}), "h")
    assert revokes.ids() == ["t"]  # the second one: no embed read, revoked alone
    assert revokes.calls[0][2].chord is None


def test_a_group_link_after_a_duplicate_first_link_has_its_members_revoked(
        app: Celery, producer: FakeProducer) -> None:
    """What the chain's caller waits on is the group link's ``GroupResult``: its members are
    never sent, and each is REVOKED (Celery's ``_fail_chain`` marks only the group's id)."""
    once, total = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("g")
        revokes = Revokes(app)
        result: Any = (once.s("g") | group(total.s(), total.s())).apply_async()
    assert [h["id"] for h in producer.sent] == [holder.id]
    members = [r.id for r in result.results]
    assert set(members) <= set(revokes.ids())
    assert result.id in revokes.ids()  # the group's own id, as _fail_chain stores it
    assert all(app.AsyncResult(m).state == celery_states.REVOKED for m in members)
    assert len(revokes.ids()) == len(set(revokes.ids()))  # each once
    with pytest.raises(TaskRevokedError, match=holder.id):
        result.get(timeout=1)


def test_a_chord_link_after_a_duplicate_first_link_has_its_body_and_header_revoked(
        app: Celery, producer: FakeProducer) -> None:
    """The chain's result is the chord's body (REVOKED, as _fail_chain descends into it);
    the header's members are REVOKED too, without counting a part (they carry no chord)."""
    once, total = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("c")
        revokes = Revokes(app)
        body: Any = (once.s("c") | chord([total.s(), total.s()], total.s())).apply_async()
    assert [h["id"] for h in producer.sent] == [holder.id]
    assert body.state == celery_states.REVOKED
    header = body.parent
    assert [r.state for r in header.results] == [celery_states.REVOKED] * 2
    assert not any(request.chord for _, _, request in revokes.calls)
    with pytest.raises(TaskRevokedError, match=holder.id):
        body.get(timeout=1)


def test_a_chain_ending_in_a_chord_whose_body_is_a_chain_is_revoked_to_its_end(
        app: Celery, producer: FakeProducer) -> None:
    once, total = _tasks(app)
    with default_producer(app, producer):
        once.delay("n")
        revokes = Revokes(app)
        last: Any = (once.s("n") | chord([total.s()], total.s() | total.s())).apply_async()
    assert last.state == celery_states.REVOKED
    assert last.id in revokes.ids()


def test_the_last_link_a_worker_publishes_is_revoked(app: Celery,
                                                      producer: FakeProducer) -> None:
    """A worker publishes a chain's next link with the rest of the chain (``chain=[]`` for
    the last one): a duplicate last link is REVOKED too, not left PENDING."""
    once, _ = _tasks(app)
    with default_producer(app, producer):
        holder = once.delay("last")
        revokes = Revokes(app)
        answer = once.s("last").set(task_id="the-last-link").apply_async(chain=[])
    assert answer.id == holder.id
    assert revokes.ids() == ["the-last-link"]
    assert app.AsyncResult("the-last-link").state == celery_states.REVOKED


def test_a_duplicate_callback_a_worker_publishes_is_revoked(app: Celery,
                                                            producer: FakeProducer) -> None:
    """A chord's callback (or a ``link``) is published by a worker through Celery's
    ``_retry_publish``; its id was made with the canvas and the caller waits on it: a
    duplicate one is REVOKED, as Celery's worker stores a revoked callback."""
    once, _ = _tasks(app)
    connection: Any = producer.connection
    connection.recoverable_connection_errors = ()  # read by Celery's publish retry
    with default_producer(app, producer):
        holder = once.delay("cb")
        revokes = Revokes(app)
        callback = once.s("cb").set(task_id="the-callback")
        answer = app.amqp._retry_publish(callback.delay)
        assert once.delay("cb").id == holder.id  # outside a callback: nothing stored
    assert answer.id == holder.id
    assert revokes.ids() == ["the-callback"]
    assert holder.id in revokes.calls[0][1]


def test_a_chord_whose_last_part_is_a_duplicate_fails_in_the_publisher(
        app: Celery, producer: FakeProducer) -> None:
    """The publisher counts a duplicate header member's part: when it is the last, Celery's
    handling of the failed chord runs there (docs/howto/unique.md, "The result backend"),
    an errback taking ``(request, exc, traceback)`` called in this process."""
    once, total = _tasks(app)
    called: list[tuple[str, str]] = []

    @app.task(name="uc.on_error", shared=False)
    def on_error(request: Any, exc: BaseException, traceback: Any) -> None:
        called.append((request.id, type(exc).__name__))

    with default_producer(app, producer):
        once.delay("e")
        callback: Any = chord([once.s("e"), once.s("e")],
                              total.s().on_error(on_error.s())).apply_async()
    assert called == [(callback.id, "ChordError")]
    assert callback.state == celery_states.FAILURE
