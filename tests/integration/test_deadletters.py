"""The Redis dead-letter sink and the dispatcher that never loses an entry, on a real Redis."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery.records import DeadLetter
from jobbers_celery.sinks import DeadLetterDispatcher, DeadLetterSink, RedisDeadLetterSink
from tests.conftest import free_port

pytestmark = pytest.mark.redis


ARG_MARKER = "arg-7f3e9c"


def _entry(task_id: str = "dl-1", attempt: int = 1, **over: Any) -> DeadLetter:
    values: dict[str, Any] = {
        "task_id": task_id,
        "name": "proj.import_catalog",
        "version": 2,
        "queue": "imports",
        "reason": "failed",
        "args": [ARG_MARKER, 42],
        "kwargs": {"dry_run": False},
        "exception_type": "builtins.ValueError",
        "exception_message": "bad row",
        "traceback": "Traceback (most recent call last): ...",
        "attempt": attempt,
        "retry_attempt": 3,
        "worker": "w1@host",
        "failed_at": datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
        "checkpoint": {"row": 17},
        "options": {"queue": "imports", "headers": {"x": 1}},
    }
    values.update(over)
    return DeadLetter(**values)


class FlakySink:
    """Delegates to a real sink, or raises while ``broken``."""

    def __init__(self, inner: DeadLetterSink) -> None:
        self.inner = inner
        self.broken = True
        self.calls = 0

    def write(self, entry: DeadLetter) -> None:
        self.calls += 1
        if self.broken:
            raise ConnectionError("sink database is down")
        self.inner.write(entry)


def _sink(store) -> RedisDeadLetterSink:
    return RedisDeadLetterSink(SimpleNamespace(store=store))  # type: ignore[arg-type]


def _dead_client() -> redis.Redis:
    """A client pointed at a port nobody listens on, failing fast (no retries)."""
    return redis.Redis(host="127.0.0.1", port=free_port(), decode_responses=True,
                       socket_connect_timeout=0.5, socket_timeout=0.5,
                       retry=Retry(NoBackoff(), 0))


def test_redis_sink_is_idempotent_per_task_and_attempt(make_store) -> None:
    store = make_store()
    sink = _sink(store)
    assert isinstance(sink, DeadLetterSink)
    first = _entry(attempt=1)
    sink.write(first)
    sink.write(first)
    sink.write(_entry(attempt=1, reason="stalled", exception_message="a later rewrite"))
    keys = store.keys
    assert store.client.hlen(keys.dead_letters) == 1
    assert store.client.zcard(keys.dead_letter_index) == 1
    assert sink.entries() == [first]  # the first write is kept, not overwritten

    second = _entry(attempt=2, failed_at=datetime(2026, 1, 2, 3, 5, tzinfo=UTC))
    sink.write(second)
    sink.write(second)
    assert store.client.hlen(keys.dead_letters) == 2
    assert sink.entries() == [second, first]  # newest first
    assert sink.entries(limit=1) == [second]
    sink.write(_entry(task_id="dl-2", attempt=1))
    assert store.client.hlen(keys.dead_letters) == 3
    assert set(store.client.hkeys(keys.dead_letters)) == {"dl-1:1", "dl-1:2", "dl-2:1"}


def test_dispatcher_writes_through_a_working_sink(make_store) -> None:
    store = make_store()
    sink = _sink(store)
    dispatcher = DeadLetterDispatcher(sink, store.client, store.keys)
    assert dispatcher.send(_entry()) is True
    assert sink.entries() == [_entry()]
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
    assert dispatcher.pending_in_memory == 0


def test_failed_sink_logs_without_payload_parks_in_outbox_and_retries(make_store, caplog
                                                                      ) -> None:
    store = make_store()
    real = _sink(store)
    flaky = FlakySink(real)
    dispatcher = DeadLetterDispatcher(flaky, store.client, store.keys)
    entry = _entry("dl-outbox")

    with caplog.at_level(logging.DEBUG, logger="jobbers.deadletter"):
        assert dispatcher.send(entry) is False
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors, caplog.text
    logged = errors[0].getMessage()
    # who, which attempt, why, and where it waits: never the payload
    for part in ("dl-outbox", "proj.import_catalog", "attempt 1", "(failed)",
                 "sink database is down", store.keys.dead_letter_outbox):
        assert part in logged, logged
    for secret in (ARG_MARKER, "bad row", "\"row\"", "dry_run"):
        assert secret not in caplog.text
    assert errors[0].exc_info is None  # a traceback would end with the sink's raw message

    outbox = store.client.lrange(store.keys.dead_letter_outbox, 0, -1)
    assert len(outbox) == 1
    assert DeadLetter.from_json(json.loads(outbox[0])) == entry
    assert dispatcher.pending_in_memory == 0
    assert real.entries() == []

    # still failing: the entry goes back to the outbox, nothing is written or lost
    assert dispatcher.retry_pending() == 0
    assert store.client.llen(store.keys.dead_letter_outbox) == 1
    assert real.entries() == []

    flaky.broken = False
    assert dispatcher.retry_pending() == 1
    assert real.entries() == [entry]
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
    assert dispatcher.retry_pending() == 0
    assert real.entries() == [entry]


def test_sink_and_redis_down_keeps_the_entry_in_memory(make_store, caplog) -> None:
    store = make_store()
    real = _sink(store)
    flaky = FlakySink(real)
    dead = _dead_client()
    dispatcher = DeadLetterDispatcher(flaky, dead, store.keys)
    entry = _entry("dl-memory", attempt=4)
    try:
        with caplog.at_level(logging.WARNING, logger="jobbers.deadletter"):
            assert dispatcher.send(entry) is False
        assert dispatcher.pending_in_memory == 1
        assert "dl-memory" in caplog.text
        assert ARG_MARKER not in caplog.text
        assert "memory only" in caplog.text
        assert store.client.llen(store.keys.dead_letter_outbox) == 0  # nothing reached Redis

        assert dispatcher.retry_pending() == 0  # sink still down
        assert dispatcher.pending_in_memory == 1

        flaky.broken = False
        # the sink works again while the outbox Redis is still unreachable
        assert dispatcher.retry_pending() == 1
        assert dispatcher.pending_in_memory == 0
        assert real.entries() == [entry]
        assert dispatcher.retry_pending() == 0
        assert real.entries() == [entry]
    finally:
        dead.close()


def test_memory_backlog_is_written_before_the_outbox(make_store) -> None:
    store = make_store()
    real = _sink(store)
    flaky = FlakySink(real)
    dead = _dead_client()
    try:
        down = DeadLetterDispatcher(flaky, dead, store.keys)
        down.send(_entry("dl-a"))
        assert down.pending_in_memory == 1
        # Redis is reachable again (same dispatcher, client swapped back), the sink is not
        down.client = store.client
        down.send(_entry("dl-b"))
        assert down.pending_in_memory == 1
        assert store.client.llen(store.keys.dead_letter_outbox) == 1
        flaky.broken = False
        assert down.retry_pending() == 2
        assert {e.task_id for e in real.entries()} == {"dl-a", "dl-b"}
        assert down.pending_in_memory == 0
        assert store.client.llen(store.keys.dead_letter_outbox) == 0
    finally:
        down.client = dead  # its retry thread may still wake up: keep it off the test db
        dead.close()


class _OutboxBreaksAfterWrite:
    """A client whose reads work but whose LREM fails: Redis dies mid-retry, after the sink
    took the entry."""

    def __init__(self, real: redis.Redis) -> None:
        self.real = real

    def lindex(self, key: str, index: int) -> Any:
        return self.real.lindex(key, index)

    def lrem(self, *args: Any) -> Any:
        raise redis.ConnectionError("connection lost")


def test_entry_stays_in_the_outbox_until_the_sink_took_it(make_store) -> None:
    store = make_store()
    real = _sink(store)
    flaky = FlakySink(real)
    dispatcher = DeadLetterDispatcher(flaky, store.client, store.keys)
    entry = _entry("dl-midway")
    dispatcher.send(entry)
    assert store.client.llen(store.keys.dead_letter_outbox) == 1

    class Killed(BaseException):
        pass

    def die(_: DeadLetter) -> None:
        raise Killed  # the process dies while the sink writes: the entry must still be there

    flaky.write = die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        dispatcher.retry_pending()
    assert store.client.llen(store.keys.dead_letter_outbox) == 1
    del flaky.write

    # the sink takes it, then Redis is lost before the entry leaves the outbox
    flaky.broken = False
    dispatcher.client = _OutboxBreaksAfterWrite(store.client)  # type: ignore[assignment]
    assert dispatcher.retry_pending() == 1
    assert real.entries() == [entry]
    assert store.client.llen(store.keys.dead_letter_outbox) == 1  # written, not yet removed
    dispatcher.client = store.client
    assert dispatcher.retry_pending() == 1  # written again: the sink keeps one
    assert real.entries() == [entry]
    assert store.client.hlen(store.keys.dead_letters) == 1
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
