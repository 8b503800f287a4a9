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

from jobbers_celery.core.records import DeadLetter
from jobbers_celery.deadletter import dispatcher as dispatching
from jobbers_celery.deadletter import errors
from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
from jobbers_celery.deadletter.redis_sink import RedisDeadLetterSink
from jobbers_celery.deadletter.sink import DeadLetterSink
from jobbers_celery.deadletter.spool import DeadLetterSpool
from jobbers_celery.store import RedisStore
from tests.conftest import free_port, wait_for

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


def _over(client: redis.Redis, store: RedisStore) -> RedisStore:
    """A store of ``store``'s dataset over ``client`` (a dispatcher's own: a test swaps its
    client to take Redis away or give it back)."""
    return RedisStore(client, store.keys.prefix)


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


def test_redis_sink_selects_finds_by_task_and_discards(make_store) -> None:
    """What ``celery jobbers dlq`` reads and removes (tests/integration/test_cli.py runs it)."""
    sink = _sink(make_store())
    at = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    entries = [_entry("a*1", 1, failed_at=at), _entry("a*1", 2, failed_at=at.replace(minute=5)),
               _entry("ab1", 1, queue="other", version=3, failed_at=at.replace(minute=6)),
               _entry("a:1", 1, name="proj.other", failed_at=at.replace(minute=7))]
    sink.write_many(entries)
    assert sink.select(name="proj.import_catalog", queue="imports") == [entries[1], entries[0]]
    assert sink.select(version=3) == [entries[2]]
    assert sink.select(name="proj.other", limit=1) == [entries[3]]
    assert sink.select(queue="nowhere") == []
    # a glob character in a task id is matched as itself (not "ab1"), newest attempt first
    assert sink.of_task("a*1") == [entries[1], entries[0]]
    assert sink.of_task("a") == []  # "a:1" is task "a:1", attempt 1... not task "a"
    assert sink.of_task("a:1") == [entries[3]]
    assert sink.discard([entries[0], entries[0], entries[2]]) == 2
    assert sink.discard([entries[0]]) == 0
    assert sink.entries() == [entries[3], entries[1]]


def test_dispatcher_writes_through_a_working_sink(make_store) -> None:
    store = make_store()
    sink = _sink(store)
    dispatcher = DeadLetterDispatcher(sink, store)
    assert dispatcher.send(_entry()) is True
    assert sink.entries() == [_entry()]
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
    assert dispatcher.pending_in_memory == 0


def test_failed_sink_logs_without_payload_parks_in_outbox_and_retries(make_store, caplog
                                                                      ) -> None:
    store = make_store()
    real = _sink(store)
    flaky = FlakySink(real)
    dispatcher = DeadLetterDispatcher(flaky, store)
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
    dispatcher = DeadLetterDispatcher(flaky, _over(dead, store))
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
        down = DeadLetterDispatcher(flaky, _over(dead, store))
        down.send(_entry("dl-a"))
        assert down.pending_in_memory == 1
        # Redis is reachable again (same dispatcher, client swapped back), the sink is not
        down.store.client = store.client
        down.send(_entry("dl-b"))
        assert down.pending_in_memory == 1
        assert store.client.llen(store.keys.dead_letter_outbox) == 1
        flaky.broken = False
        assert down.retry_pending() == 2
        assert {e.task_id for e in real.entries()} == {"dl-a", "dl-b"}
        assert down.pending_in_memory == 0
        assert store.client.llen(store.keys.dead_letter_outbox) == 0
    finally:
        down.store.client = dead  # its retry thread may wake up: keep it off the test db
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
    dispatcher = DeadLetterDispatcher(flaky, _over(store.client, store))
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
    dispatcher.store.client = _OutboxBreaksAfterWrite(store.client)  # type: ignore[assignment]
    assert dispatcher.retry_pending() == 1
    assert real.entries() == [entry]
    assert store.client.llen(store.keys.dead_letter_outbox) == 1  # written, not yet removed
    dispatcher.store.client = store.client
    assert dispatcher.retry_pending() == 1  # written again: the sink keeps one
    assert real.entries() == [entry]
    assert store.client.hlen(store.keys.dead_letters) == 1
    assert store.client.llen(store.keys.dead_letter_outbox) == 0


# --------------------------------------------------------------------------- the spool


def _spooled(spool: DeadLetterSpool) -> list[DeadLetter]:
    found = []
    for path in spool.paths():
        with spool.claim(path) as claimed:
            assert claimed is not None
            found.extend(claimed.entries)
    return found


def test_sink_and_redis_down_keeps_the_entry_on_disk_not_in_memory(make_store, tmp_path,
                                                                    caplog) -> None:
    store = make_store()
    real = _sink(store)
    flaky = FlakySink(real)
    dead = _dead_client()
    spool = DeadLetterSpool(tmp_path / "spool")
    dispatcher = DeadLetterDispatcher(flaky, _over(dead, store), spool=spool)
    entry = _entry("dl-disk", attempt=2)
    try:
        with caplog.at_level(logging.DEBUG, logger="jobbers.deadletter"):
            assert dispatcher.send(entry) is False
        assert dispatcher.pending_in_memory == 0
        assert _spooled(spool) == [entry]
        [path] = spool.paths()
        [line] = [r.getMessage() for r in caplog.records if "dl-disk" in r.getMessage()]
        assert str(path) in line
        assert "attempt 2" in line
        assert "Redis outbox unavailable" in line
        assert ARG_MARKER not in caplog.text
        assert "bad row" not in caplog.text

        # everything still down: it stays where it is
        assert dispatcher.retry_pending() == 0
        assert spool.paths() == [path]

        # the sink is back, Redis is not: written from the spool, the file removed
        flaky.broken = False
        assert dispatcher.retry_pending() == 1
        assert real.entries() == [entry]
        assert spool.paths() == []
        assert dispatcher.retry_pending() == 0
        assert store.client.hlen(store.keys.dead_letters) == 1
    finally:
        dispatcher.store.client = _dead_client()
        dead.close()


def test_spooled_entries_move_to_the_outbox_once_redis_is_back(make_store, tmp_path) -> None:
    store = make_store()
    real = _sink(store)
    flaky = FlakySink(real)
    dead = _dead_client()
    spool = DeadLetterSpool(tmp_path)
    dispatcher = DeadLetterDispatcher(flaky, _over(dead, store), spool=spool)
    entries = [_entry(f"dl-move-{i}") for i in range(3)]
    dispatcher.send_many(entries)
    assert len(_spooled(spool)) == 3
    assert len(spool.paths()) == 1  # one file for the batch

    dispatcher.store.client = store.client  # Redis answers again; the sink still refuses
    assert dispatcher.retry_pending() == 0
    assert spool.paths() == []  # on to the outbox, which every machine's workers drain
    outbox = store.client.lrange(store.keys.dead_letter_outbox, 0, -1)
    assert [DeadLetter.from_json(json.loads(raw)) for raw in outbox] == entries

    flaky.broken = False
    assert dispatcher.retry_pending() == 3
    assert sorted(e.task_id for e in real.entries()) == [e.task_id for e in entries]
    assert store.client.llen(store.keys.dead_letter_outbox) == 0


def test_a_spool_left_by_a_dead_process_is_delivered_by_another(make_store, tmp_path,
                                                                 monkeypatch) -> None:
    store = make_store()
    real = _sink(store)
    dead = _dead_client()
    before = DeadLetterDispatcher(FlakySink(real), _over(dead, store),
                                  spool=DeadLetterSpool(tmp_path))
    left = [_entry(f"dl-left-{i}") for i in range(2)]
    for entry in left:
        before.send(entry)
    before._stop.set()  # the process is gone: its retry thread with it
    dead.close()
    assert len(DeadLetterSpool(tmp_path).paths()) == 2

    # a new process on the machine: its first successful write starts the drain
    monkeypatch.setattr(dispatching, "_RETRY_EVERY_S", 0.05)
    after = DeadLetterDispatcher(real, store, spool=DeadLetterSpool(tmp_path))
    assert after.send(_entry("dl-new")) is True
    wait_for(lambda: not after.spool.paths(), timeout=10,  # type: ignore[union-attr]
             message="the spool to be drained")
    assert sorted(e.task_id for e in real.entries()) == ["dl-left-0", "dl-left-1", "dl-new"]
    assert store.client.hlen(store.keys.dead_letters) == 3


def test_a_spool_file_is_written_with_write_many_when_the_sink_has_it(make_store,
                                                                      tmp_path) -> None:
    store = make_store()
    real = _sink(store)

    class Batching:
        def __init__(self) -> None:
            self.batches: list[int] = []
            self.writes = 0

        def write(self, entry: DeadLetter) -> None:
            self.writes += 1
            real.write(entry)

        def write_many(self, entries: Any) -> None:
            self.batches.append(len(entries))
            real.write_many(entries)

    spool = DeadLetterSpool(tmp_path)
    entries = [_entry(f"dl-batch-{i}") for i in range(20)]
    spool.write(entries)
    sink = Batching()
    dispatcher = DeadLetterDispatcher(sink, store, spool=spool)
    assert dispatcher.retry_pending() == 20
    assert sink.batches == [20]
    assert sink.writes == 0
    assert spool.paths() == []
    assert store.client.hlen(store.keys.dead_letters) == 20


def test_memory_only_when_the_disk_refuses_too_and_settled_at_exit(make_store, tmp_path,
                                                                   caplog) -> None:
    store = make_store()
    real = _sink(store)
    flaky = FlakySink(real)
    dead = _dead_client()
    (tmp_path / "file").write_text("")
    spool = DeadLetterSpool(tmp_path / "file" / "spool")  # cannot be created
    dispatcher = DeadLetterDispatcher(flaky, _over(dead, store), spool=spool)
    try:
        with caplog.at_level(logging.WARNING, logger="jobbers.deadletter"):
            assert dispatcher.send(_entry("dl-mem-1")) is False
            assert dispatcher.send(_entry("dl-mem-2")) is False
        assert dispatcher.pending_in_memory == 2
        assert "spool" in caplog.text
        assert "memory only" in caplog.text

        # at exit Redis answers again: what memory held goes to the outbox
        dispatcher.store.client = store.client
        dispatcher.close()
        assert dispatcher.pending_in_memory == 0
        assert store.client.llen(store.keys.dead_letter_outbox) == 2
    finally:
        dead.close()


def test_entries_nobody_took_by_exit_are_logged_lost_without_payload(make_store, tmp_path,
                                                                     caplog) -> None:
    store = make_store()
    dead = _dead_client()
    (tmp_path / "file").write_text("")
    dispatcher = DeadLetterDispatcher(FlakySink(_sink(store)), _over(dead, store),
                                      spool=DeadLetterSpool(tmp_path / "file" / "x"))
    try:
        dispatcher.send(_entry("dl-lost"))
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="jobbers.deadletter"):
            dispatcher.close()
            dispatcher.close()  # idempotent
        [line] = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
        assert "dl-lost" in line
        assert ARG_MARKER not in caplog.text
        assert dispatcher.pending_in_memory == 0
    finally:
        dead.close()


def test_a_sink_error_quoting_the_entry_is_logged_without_its_values(make_store, caplog
                                                                     ) -> None:
    store = make_store()

    class Quoting:
        """A database error quotes the row it refused (PostgreSQL's DETAIL does)."""

        def write(self, entry: DeadLetter) -> None:
            raise ValueError(f"null value violates a constraint. DETAIL: Failing row "
                             f"contains ({entry.task_id}, {json.dumps(entry.args)}, "
                             f"{entry.kwargs!r}, {entry.exception_message!r})")

    dispatcher = DeadLetterDispatcher(Quoting(), store)
    entry = _entry("dl-quoted", kwargs={"password": "hunter2-secret"})
    with caplog.at_level(logging.DEBUG, logger="jobbers.deadletter"):
        dispatcher.send(entry)
        dispatcher.send_many([_entry("dl-quoted-2"), _entry("dl-quoted-3")])
    text = caplog.text
    assert "Failing row contains (dl-quoted" in text  # the task id is not a secret
    assert "[redacted]" in text
    for secret in (ARG_MARKER, "hunter2-secret", "bad row"):
        assert secret not in text
    assert all(r.exc_info is None for r in caplog.records)


def test_describe_error_takes_out_every_value_form() -> None:
    entry = _entry(args=["s3cr3t \"quoted\"", 123456], kwargs={"k": {"nested": "deep-value"}},
                   checkpoint={"cursor": "ckpt-xyz"}, options={"headers": {"auth": "hdr-tok"}})
    exc = RuntimeError('row: ["s3cr3t \\"quoted\\"", 123456] {"nested": "deep-value"} '
                       "'s3cr3t \"quoted\"' ckpt-xyz hdr-tok id 12")
    text = errors.describe_error(exc, [entry])
    for secret in ("s3cr3t", "123456", "deep-value", "ckpt-xyz", "hdr-tok"):
        assert secret not in text, text
    assert text.startswith("RuntimeError: row:")
    assert "id 12" in text  # short values are left alone
    long = errors.describe_error(RuntimeError("x" * 5000), [entry])
    assert len(long) < 600


def test_a_forked_child_leaves_the_memory_backlog_to_its_parent(make_store) -> None:
    import os

    store = make_store()
    dead = _dead_client()
    dispatcher = DeadLetterDispatcher(FlakySink(_sink(store)), _over(dead, store))
    try:
        dispatcher.send(_entry("dl-fork"))
        assert dispatcher.pending_in_memory == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it holds, then leave without cleanup
            os.write(write, str(dispatcher.pending_in_memory).encode())
            os._exit(0)
        os.close(write)
        assert os.read(read, 16) == b"0"
        os.close(read)
        os.waitpid(pid, 0)
        assert dispatcher.pending_in_memory == 1  # the parent still has it
    finally:
        dispatcher._stop.set()
        dead.close()
