"""Dead letters written in batches (``write_many`` / ``send_many``) and the cleaner's bound on
one pass, on a real Redis.

The cleaner builds every dead letter of a pass and sends them at once: with the default
Redis sink that is one pipeline (one round trip) instead of one MULTI/EXEC per entry. A
sink with ``write`` only keeps working; a failing batch is written, or parked in the outbox,
entry by entry, so nothing is lost.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection
from redis.retry import Retry

from jobbers_celery import TaskState
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.deadletter import dispatcher as dispatching
from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
from jobbers_celery.deadletter.redis_sink import RedisDeadLetterSink
from jobbers_celery.deadletter.sink import DeadLetterSink
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle.cleaner import Cleaner, CleanReport
from jobbers_celery.store import RedisStore
from tests.conftest import free_port, wait_for
from tests.integration.stall_helpers import last_seen, resumed_at, ticking

pytestmark = pytest.mark.redis

S = TaskState

LOST_AFTER_S = 3.0  # proj: jobbers_worker_lost_after
ARG_MARKER = "arg-b47c1d"
T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def _entry(task_id: str, attempt: int = 1, **over: Any) -> DeadLetter:
    values: dict[str, Any] = {
        "task_id": task_id,
        "name": "proj.import_catalog",
        "version": 2,
        "queue": "imports",
        "reason": "stalled",
        "args": [ARG_MARKER, 42],
        "kwargs": {"dry_run": False},
        "exception_type": None,
        "exception_message": "stalled: worker w1 not seen for 5.0s",
        "traceback": None,
        "attempt": attempt,
        "retry_attempt": 0,
        "worker": "w1@host",
        "failed_at": T0,
        "checkpoint": {"row": 17},
        "options": {"queue": "imports"},
    }
    values.update(over)
    return DeadLetter(**values)


def _batch(prefix: str, n: int) -> list[DeadLetter]:
    return [_entry(f"{prefix}-{i:04d}", failed_at=T0 + timedelta(seconds=i)) for i in range(n)]


def _sink(store: RedisStore) -> RedisDeadLetterSink:
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


def _stored(store: RedisStore) -> tuple[dict[str, str], list[tuple[str, float]]]:
    """The whole dead-letter hash and time index."""
    k = store.keys
    return (store.client.hgetall(k.dead_letters),
            store.client.zrange(k.dead_letter_index, 0, -1, withscores=True))


class WriteOnlySink:
    """A third-party sink from before ``write_many``: ``write`` only."""

    def __init__(self, inner: RedisDeadLetterSink) -> None:
        self.inner = inner
        self.writes = 0

    def write(self, entry: DeadLetter) -> None:
        self.writes += 1
        self.inner.write(entry)


class BrokenBatchSink:
    """``write_many`` writes the first ``partial`` entries for real, then raises; ``write``
    delegates to the real sink, or raises while ``broken``."""

    def __init__(self, inner: RedisDeadLetterSink, partial: int = 0,
                 broken: bool = True) -> None:
        self.inner = inner
        self.partial = partial
        self.broken = broken
        self.batches = 0
        self.writes = 0

    def write(self, entry: DeadLetter) -> None:
        self.writes += 1
        if self.broken:
            raise ConnectionError("sink database is down")
        self.inner.write(entry)

    def write_many(self, entries: list[DeadLetter]) -> None:
        self.batches += 1
        self.inner.write_many(entries[:self.partial])
        raise ConnectionError("batch cut short")


@contextmanager
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every request sent to Redis meanwhile (one item per round trip), as bytes."""
    sent: list[bytes] = []
    lock = threading.Lock()
    original = AbstractConnection.send_packed_command

    def spy(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        parts = [command] if isinstance(command, (bytes, str, memoryview)) else command
        data = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts)
        with lock:
            sent.append(data)
        return original(self, command, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(AbstractConnection, "send_packed_command", spy)
        yield sent


def _hsetnx_trips(sent: list[bytes]) -> list[int]:
    """Per round trip that writes dead letters, how many HSETNX it carries."""
    counts = [data.count(b"\r\nHSETNX\r\n") for data in sent]
    return [c for c in counts if c]


# --------------------------------------------------------------------------- the Redis sink


def test_write_many_is_idempotent_per_task_and_attempt(make_store, monkeypatch) -> None:
    store = make_store()
    sink = _sink(store)
    assert isinstance(sink, DeadLetterSink)
    entries = [*_batch("wm", 50), _entry("wm-0000", attempt=2, failed_at=T0 - timedelta(1))]

    store.client.ping()  # connected (the handshake is not counted)
    with round_trips(monkeypatch) as sent:
        sink.write_many(entries)
    assert len(sent) == 1, "one round trip for the whole batch"
    assert _hsetnx_trips(sent) == [51]
    first = _stored(store)
    assert len(first[0]) == len(first[1]) == 51

    sink.write_many(entries)  # the same entries again: one copy each
    sink.write_many([_entry("wm-0003", reason="failed", exception_message="a later rewrite")])
    assert _stored(store) == first  # nothing added, nothing overwritten, no score moved
    assert sink.entries(limit=100)[-1] == entries[-1]  # oldest: attempt 2, a day earlier
    assert {e.task_id for e in sink.entries(limit=100)} == {e.task_id for e in entries}
    assert sink.entries(limit=100)[0] == entries[49]

    sink.write_many([])  # no round trip, no error
    assert _stored(store) == first


def test_write_many_stores_exactly_what_write_stores(make_store) -> None:
    """Same keys, fields, JSON and index scores as one ``write`` per entry."""
    one, many = make_store(prefix="one"), make_store(prefix="many")
    entries = _batch("same", 20)
    for entry in entries:
        _sink(one).write(entry)
    _sink(many).write_many(entries)
    assert _stored(one) == _stored(many)
    assert _sink(one).entries() == _sink(many).entries()


def test_write_many_over_new_and_existing_entries(make_store) -> None:
    store = make_store()
    sink = _sink(store)
    existing = _batch("mix", 10)[::2]  # written earlier, one at a time
    for entry in existing:
        sink.write(entry)
    before = _stored(store)

    # the batch rewrites the existing ones with other content and adds the new ones
    batch = [_entry(e.task_id, reason="failed", exception_message="rewritten",
                    failed_at=e.failed_at + timedelta(hours=1)) if e in existing else e
             for e in _batch("mix", 10)]
    sink.write_many(batch)
    hash_, index = _stored(store)
    assert len(hash_) == len(index) == 10
    for member, raw in before[0].items():
        assert hash_[member] == raw  # kept as first written
    scores = dict(index)
    for member, score in before[1]:
        assert scores[member] == score  # index scores of the old ones kept too
    written = {e.task_id: e for e in sink.entries(limit=20)}
    assert written == {e.task_id: e for e in _batch("mix", 10)}


# --------------------------------------------------------------------------- the dispatcher


def test_send_many_through_a_sink_without_write_many(make_store) -> None:
    store = make_store()
    sink = WriteOnlySink(_sink(store))
    assert isinstance(sink, DeadLetterSink)  # what Jobbers checks: still a valid sink
    assert not hasattr(sink, "write_many")
    dispatcher = DeadLetterDispatcher(sink, store)
    entries = _batch("wo", 7)
    assert dispatcher.send_many(entries) == [True] * 7
    assert sink.writes == 7
    assert sorted(sink.inner.entries(), key=lambda e: e.task_id) == entries
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
    assert dispatcher.send_many([]) == []


def test_send_many_uses_write_many_when_the_sink_has_it(make_store, monkeypatch) -> None:
    store = make_store()
    dispatcher = DeadLetterDispatcher(_sink(store), store)
    entries = _batch("fast", 300)
    store.client.ping()  # connected (the handshake is not counted)
    with round_trips(monkeypatch) as sent:
        assert dispatcher.send_many(entries) == [True] * 300
    assert len(sent) == 1
    assert _hsetnx_trips(sent) == [300]
    assert store.client.hlen(store.keys.dead_letters) == 300


def test_failing_write_many_falls_back_and_parks_every_entry(make_store, caplog,
                                                             monkeypatch) -> None:
    store = make_store()
    real = _sink(store)
    sink = BrokenBatchSink(real, partial=2)  # two entries got through before the failure
    dispatcher = DeadLetterDispatcher(sink, store)
    entries = _batch("park", 20)

    with caplog.at_level(logging.WARNING, logger="jobbers.deadletter"), \
            round_trips(monkeypatch) as sent:
        assert dispatcher.send_many(entries) == [False] * 20
    assert sink.batches == 1
    # the sink is down: tried entry by entry a few times, not once per entry
    assert sink.writes == dispatching._GIVE_UP_AFTER
    # every entry is logged (task id, attempt, where it waits), never its payload
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    for entry in entries:
        [line] = [m for m in errors if f"[{entry.task_id}]" in m]
        assert store.keys.dead_letter_outbox in line
    assert ARG_MARKER not in caplog.text
    assert '"row": 17' not in caplog.text
    outbox = store.client.lrange(store.keys.dead_letter_outbox, 0, -1)
    assert [DeadLetter.from_json(json.loads(raw)) for raw in outbox] == entries
    assert sum(1 for data in sent if b"RPUSH" in data) == 1  # parked with one command
    assert dispatcher.pending_in_memory == 0

    # the sink works again: the outbox is written, one copy each (2 were already there)
    sink.broken = False
    assert dispatcher.retry_pending() == 20
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
    assert sorted(real.entries(limit=50), key=lambda e: e.task_id) == entries
    assert store.client.hlen(store.keys.dead_letters) == 20


def test_failing_write_many_with_a_working_write_writes_each_once(make_store, caplog) -> None:
    store = make_store()
    real = _sink(store)
    sink = BrokenBatchSink(real, partial=5, broken=False)
    dispatcher = DeadLetterDispatcher(sink, store)
    entries = _batch("half", 12)
    with caplog.at_level(logging.WARNING, logger="jobbers.deadletter"):
        assert dispatcher.send_many(entries) == [True] * 12
    assert "one at a time" in caplog.text
    assert sink.writes == 12
    assert sorted(real.entries(), key=lambda e: e.task_id) == entries
    assert store.client.hlen(store.keys.dead_letters) == 12  # the 5 written twice: once
    assert store.client.llen(store.keys.dead_letter_outbox) == 0


def test_send_many_with_the_sink_and_redis_down_keeps_entries_in_memory(make_store,
                                                                         caplog) -> None:
    store = make_store()
    real = _sink(store)
    sink = BrokenBatchSink(real)
    dead = _dead_client()
    dispatcher = DeadLetterDispatcher(sink, _over(dead, store))
    entries = _batch("mem", 5)
    try:
        with caplog.at_level(logging.WARNING, logger="jobbers.deadletter"):
            assert dispatcher.send_many(entries) == [False] * 5
        assert dispatcher.pending_in_memory == 5
        assert "memory only" in caplog.text
        sink.broken = False
        assert dispatcher.retry_pending() == 5
        assert dispatcher.pending_in_memory == 0
        assert sorted(real.entries(), key=lambda e: e.task_id) == entries
    finally:
        dead.close()


# --------------------------------------------------------------------------- the cleaner


def fabricate(store: RedisStore, ids: list[str], *, wid: str, hb_ms: int | None) -> None:
    """Started tasks with ``dead_letter_policy=save`` and no stall recovery, built through
    the store's own steps (as a worker would)."""
    msg = json.dumps({"args": [ARG_MARKER], "kwargs": {"n": 1}, "options": {}})
    for task_id in ids:
        res = store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                         create={"name": "proj.add", "queue": "celery", "ver": "1", "dlq": "1"},
                         set_fields={"msg": msg, "retries": "0"}, reason="published",
                         name="proj.add")
        assert res.applied, res
        fields = {"srec": "0"}
        if hb_ms is not None:
            fields["hb_iv"] = str(hb_ms)
        res = store.step(task_id, S.STARTED, start=True, worker="ghost@localhost", wid=wid,
                         heartbeat_ms=hb_ms, set_fields=fields, name="proj.add")
        assert res.applied, res
        assert res.attempt == 1, res


def _grace_over(store: RedisStore) -> None:
    """Silence counts from the first tick of a fresh database: wait until that is older
    than worker_lost_after."""
    wait_for(lambda: store.now_ms() - resumed_at(store)
             > LOST_AFTER_S * 1000 + 200, timeout=10, message="the grace to end")


def _deadlines_passed(store: RedisStore) -> None:
    """Heartbeat deadlines of 1 ms: wait until the Redis clock is surely past them."""
    start = store.now_ms()
    wait_for(lambda: store.now_ms() - start > 10, timeout=5, message="10 ms of Redis time")


def test_cleaner_pass_dead_letters_in_one_round_trip(proj, monkeypatch) -> None:
    jobbers = proj.jobbers
    store = jobbers.store
    assert type(jobbers.sink) is RedisDeadLetterSink
    n = 450  # three stall.lua chunks of 200 at most: all dead letters sent together
    ids = [f"dl-batch-{i:03d}" for i in range(n)]
    with ticking(store) as live:
        fabricate(store, ids, wid=live, hb_ms=1)  # heartbeat deadlines pass at once
        _deadlines_passed(store)
        with round_trips(monkeypatch) as sent:
            report = jobbers.cleaner.run(by="batch test")

    trips = _hsetnx_trips(sent)
    print(f"\ncleaner pass over {n} stalled tasks: {len(sent)} round trips in all, "
          f"dead letters in {len(trips)} ({report.duration_ms:.0f} ms)")
    assert report.examined == report.stalled == n
    assert sorted(report.dead_lettered) == ids
    assert trips == [n], "one round trip for all the dead letters of the pass"
    assert not any(b"dlq:outbox" in data for data in sent)
    assert store.client.llen(store.keys.dead_letter_outbox) == 0

    entries = {e.task_id: e for e in jobbers.sink.entries(limit=1000)}
    assert sorted(entries) == ids
    for task_id in ids[:5] + ids[-5:]:
        entry = entries[task_id]
        [stalled] = [t for t in jobbers.history(task_id) if t.to_state == S.STALLED]
        assert (entry.reason, entry.attempt, entry.name) == ("stalled", 1, "proj.add")
        assert entry.exception_message == stalled.reason
        assert entry.failed_at == stalled.at
        assert entry.args == [ARG_MARKER]
        assert entry.worker == "ghost@localhost"

    # a second pass finds nothing, writes nothing
    with round_trips(monkeypatch) as sent:
        again = jobbers.cleaner.run(by="batch test")
    assert again.examined == 0
    assert _hsetnx_trips(sent) == []
    assert store.client.hlen(store.keys.dead_letters) == n


def test_cleaner_pass_with_a_failing_sink_parks_the_dead_letters(proj, monkeypatch) -> None:
    jobbers = proj.jobbers
    store = jobbers.store
    sink = BrokenBatchSink(_sink(store))
    monkeypatch.setattr(jobbers.dead_letters, "sink", sink)
    ids = [f"dl-park-{i:02d}" for i in range(30)]
    with ticking(store) as live:
        fabricate(store, ids, wid=live, hb_ms=1)
        _deadlines_passed(store)
        report = jobbers.cleaner.run(by="failing sink")
    assert sorted(report.dead_lettered) == ids  # handed over: parked, not lost
    outbox = store.client.lrange(store.keys.dead_letter_outbox, 0, -1)
    assert sorted(DeadLetter.from_json(json.loads(raw)).task_id for raw in outbox) == ids
    sink.broken = False
    assert jobbers.dead_letters.retry_pending() == 30
    assert sorted(e.task_id for e in sink.inner.entries()) == ids


# --------------------------------------------------------------------------- pass bound


def test_cleaner_bounds_a_pass_in_total_over_dead_incarnations(proj, monkeypatch) -> None:
    """PASS_LIMIT bounds the whole pass (not each dead incarnation) and verdicts go to
    stall.lua STALL_CHUNK at a time; the rest waits for later passes, and each dead
    incarnation is forgotten once it has no task left."""
    limit, chunk = 50, 20
    jobbers: Jobbers = proj.jobbers
    bounded = Cleaner(jobbers.store, jobbers.config, jobbers.recorder, jobbers.publisher,
                      pass_limit=limit, stall_chunk=chunk)
    store = jobbers.store
    client = store.client
    dead = [f"dead{w}:1:abc00{w}" for w in range(3)]
    ids = {wid: [f"bound-{w}-{i:02d}" for i in range(40)] for w, wid in enumerate(dead)}
    all_ids = sorted(i for group in ids.values() for i in group)

    chunks: list[int] = []
    real_stall = store.stall

    def stall(items: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        chunks.append(len(items))
        return real_stall(items, *args, **kwargs)

    monkeypatch.setattr(store, "stall", stall)

    def remembered() -> set[str]:
        return {w for w in dead if any(s is not None for s in last_seen(store, w))}

    def with_tasks() -> set[str]:
        return {w for w in dead
                if any(client.zcard(k.worker_tasks(w)) for k in store.shards.keys)}

    reports: list[CleanReport] = []
    with ticking(store) as live:
        for wid, group in ids.items():
            fabricate(store, group, wid=wid, hb_ms=None)  # only worker liveness finds them
        for w in dead:
            last_seen(store, w, store.now_ms() - 60_000)
        _grace_over(store)
        while not reports or reports[-1].examined:
            assert len(reports) < 10, [r.examined for r in reports]
            chunks.clear()
            reports.append(bounded.run(by="bounded"))
            assert max(chunks, default=0) <= chunk, chunks
            # an incarnation is forgotten once (and only once) it has no task left
            assert remembered() == with_tasks(), (len(reports), remembered(), with_tasks())
        assert None not in last_seen(store, live)

    print("\npasses: " + "; ".join(f"examined {r.examined}, stalled {r.stalled}, "
                                   f"{r.duration_ms:.0f} ms" for r in reports))
    first = reports[0]
    assert 0 < first.examined <= limit
    assert first.stalled == first.examined  # no grace left: every candidate judged stalled
    assert all(r.examined <= limit for r in reports)
    assert [r.examined for r in reports] == [50, 50, 20, 0]
    assert remembered() == set()

    # every task stalled exactly once, and dead-lettered exactly once
    assert sum(r.stalled for r in reports) == 120
    lettered = [i for r in reports for i in r.dead_lettered]
    assert sorted(lettered) == all_ids
    for task_id in all_ids:
        moves = [(t.from_state, t.to_state) for t in store.history(task_id)]
        assert Counter(moves)[(S.STARTED, S.STALLED)] == 1, (task_id, moves)
        assert store.get_raw(task_id)["state"] == S.STALLED.value
    assert sorted(client.hkeys(store.keys.dead_letters)) == [f"{i}:1" for i in all_ids]
    assert store.counts()[S.STARTED] == 0
