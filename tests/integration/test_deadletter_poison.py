"""The dead-letter path is total: an entry a sink cannot store never holds up the ones behind
it, on any path (direct send, batch, memory, spool, outbox), and is never silently dropped.

``StrictSink`` is an in-memory sink that refuses what PostgreSQL refuses (NaN and Infinity
in JSON, NUL, lone surrogates, an id over 255 characters, a count over 32 bits, nesting
that ``json`` cannot write) with the kind of error a database driver raises about a value,
and can be made to refuse one task id whatever its form, or to be down (an outage)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery import DeadLetterRefused
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.deadletter.aside import KEEP
from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
from jobbers_celery.deadletter.redis_sink import RedisDeadLetterSink
from jobbers_celery.deadletter.spool import DeadLetterSpool
from jobbers_celery.store import RedisStore
from tests.conftest import ROOT, free_port, subprocess_env

pytestmark = pytest.mark.redis

SECRET = "arg-0d5e7b"


def _entry(task_id: str, **over: Any) -> DeadLetter:
    values: dict[str, Any] = {
        "task_id": task_id, "name": "proj.charge", "version": 1, "queue": "billing",
        "reason": "failed", "args": [SECRET, 1], "kwargs": {"k": "v"},
        "exception_type": "builtins.ValueError", "exception_message": "declined",
        "traceback": "Traceback ...", "attempt": 1, "retry_attempt": 0, "worker": "w1@host",
        "failed_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "checkpoint": None,
        "options": {"queue": "billing"},
    }
    values.update(over)
    return DeadLetter(**values)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


#: Every poison case of the issue, each behind its own task id.
POISON: dict[str, dict[str, Any]] = {
    "p-nan": {"args": [float("nan")]},
    "p-inf": {"kwargs": {"x": float("inf")}},
    "p-nul": {"args": ["a\x00b"], "exception_message": "bad \x00 byte"},
    "p-surrogate": {"args": ["\ud800"], "exception_message": "lone \udfff"},
    "p-long-name": {"name": "n" * 300},
    "p-long-queue": {"queue": "q" * 256},
    "p-long-worker": {"worker": "w" * 1000},
    "p-deep": {"args": [_nested(950)]},
    "p-deeper": {"checkpoint": _nested(5000)},
    "p-retries": {"retry_attempt": 2**40},
}


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


class StrictSink:
    """Stores entries in memory as PostgreSQL would (see the module docstring)."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, int], DeadLetter] = {}
        self.down = False
        self.refuse: set[str] = set()

    def write(self, entry: DeadLetter) -> None:
        if self.down:
            raise ConnectionError("could not connect to the database")
        if entry.task_id in self.refuse:
            raise DeadLetterRefused(f"check constraint violated by {entry.args!r}")
        text = json.dumps(entry.to_json(), allow_nan=False)  # NaN: ValueError; deep: Recursion
        if re.search(r"(?<!\\)(?:\\\\)*\\u0000", text):  # a NUL, not an escaped one
            raise ValueError("unsupported Unicode escape sequence \\u0000")
        text.encode()  # ensure_ascii keeps surrogates escaped: check the values themselves
        json.dumps(entry.to_json(), ensure_ascii=False).encode("utf-8")
        for name in ("task_id", "name", "queue", "worker", "exception_type"):
            value = getattr(entry, name)
            if value is not None and len(value) > 255:
                raise ValueError(f"value too long for type character varying(255): {name}")
        if _depth(entry.to_json()) > 500:
            raise ValueError("stack depth limit exceeded")  # PostgreSQL's, as the driver's
        if not 0 <= entry.retry_attempt < 2**31:
            raise OverflowError("integer out of range")
        self.stored[(entry.task_id, entry.attempt)] = entry


def _dead_client() -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=free_port(), decode_responses=True,
                       socket_connect_timeout=0.5, socket_timeout=0.5,
                       retry=Retry(NoBackoff(), 0))


def _over(client: redis.Redis, store: RedisStore) -> RedisStore:
    """A store of ``store``'s dataset over ``client`` (a dispatcher's own: a test swaps its
    client to take Redis away or give it back)."""
    return RedisStore(client, store.keys.prefix)


def _normal(n: int) -> list[DeadLetter]:
    return [_entry(f"ok-{i}") for i in range(n)]


def _poison() -> list[DeadLetter]:
    return [_entry(task_id, **fields) for task_id, fields in POISON.items()]


def test_every_entry_parked_behind_poison_is_written(make_store) -> None:
    store = make_store()
    sink = StrictSink()
    dispatcher = DeadLetterDispatcher(sink, store)
    sink.down = True  # an outage: every entry is parked in the outbox, in order
    mixed = [e for pair in zip(_poison(), _normal(len(POISON)), strict=True) for e in pair]
    for entry in mixed:
        assert dispatcher.send(entry) is False
    assert store.client.llen(store.keys.dead_letter_outbox) == len(mixed)
    assert dispatcher.retry_pending() == 0  # still down: all wait, in order
    assert store.client.llen(store.keys.dead_letter_outbox) == len(mixed)

    sink.down = False
    assert dispatcher.retry_pending(limit=1000) == len(mixed)
    assert {task_id for task_id, _ in sink.stored} == {e.task_id for e in mixed}
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
    for task_id in POISON:
        shown = sink.stored[(task_id, 1)]
        assert shown.altered, task_id  # stored visibly altered, and says so
        assert shown.unpublishable or set(shown.altered) <= {
            "worker", "exception_message", "traceback", "retry_attempt"}
    assert not sink.stored[("ok-0", 1)].altered
    assert dispatcher.aside.report().total == 0  # nothing set aside: all stored


def test_an_entry_refused_in_every_form_is_set_aside_and_the_rest_drain(make_store,
                                                                         caplog) -> None:
    store = make_store()
    sink = StrictSink()
    dispatcher = DeadLetterDispatcher(sink, store)
    sink.down = True
    for entry in [_entry("refused-1"), *_normal(3)]:
        dispatcher.send(entry)
    sink.down = False
    sink.refuse = {"refused-1"}
    with caplog.at_level(logging.INFO, logger="jobbers.deadletter"):
        assert dispatcher.retry_pending() == 3
    assert set(sink.stored) == {(f"ok-{i}", 1) for i in range(3)}
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
    report = dispatcher.aside.report()
    assert (report.kept, report.total) == (1, 1)
    [item] = report.entries
    assert (item.task_id, item.name, item.attempt, item.source) == (
        "refused-1", "proj.charge", 1, "outbox")
    assert "check constraint" in item.why
    assert SECRET not in item.why
    assert SECRET not in caplog.text
    assert item.entry is not None
    assert DeadLetter.from_json(json.loads(item.entry)) == _entry("refused-1")  # whole
    assert "set aside" in caplog.text


def test_a_direct_send_and_a_batch_never_wait_on_poison(make_store) -> None:
    store = make_store()
    sink = StrictSink()
    sink.refuse = {"refused-2"}
    dispatcher = DeadLetterDispatcher(sink, store)
    assert dispatcher.send(_entry("p-nan", args=[float("nan")])) is True
    assert sink.stored[("p-nan", 1)].args == ["NaN"]
    assert dispatcher.send(_entry("refused-2")) is False
    batch = [*_poison(), _entry("refused-3"), *_normal(3)]
    sink.refuse.add("refused-3")
    sent = dispatcher.send_many(batch)
    assert sent == [True] * len(POISON) + [False] + [True] * 3
    assert store.client.llen(store.keys.dead_letter_outbox) == 0  # nothing left waiting
    assert [i.task_id for i in dispatcher.aside.report().entries] == ["refused-3", "refused-2"]


def test_the_memory_backlog_and_the_spool_set_aside_too(make_store, tmp_path) -> None:
    store = make_store()
    sink = StrictSink()
    sink.down = True
    dead = _dead_client()
    spool = DeadLetterSpool(tmp_path / "spool")
    try:
        on_disk = DeadLetterDispatcher(sink, _over(dead, store), spool=spool)
        in_memory = DeadLetterDispatcher(sink, _over(dead, store))
        for dispatcher in (on_disk, in_memory):
            for entry in [_entry("refused-4"), *_poison(), *_normal(2)]:
                dispatcher.send(entry)
        assert in_memory.pending_in_memory == len(POISON) + 3
        assert spool.count() == len(POISON) + 3
        sink.down = False
        sink.refuse = {"refused-4"}
        on_disk.store.client = store.client
        in_memory.store.client = store.client
        assert on_disk.retry_pending(limit=1000) == len(POISON) + 2
        assert in_memory.retry_pending(limit=1000) == len(POISON) + 2
        assert spool.paths() == []
        assert in_memory.pending_in_memory == 0
        assert {i.source for i in on_disk.aside.report().entries} == {"spool", "memory"}
        assert store.client.llen(store.keys.dead_letter_outbox) == 0
    finally:
        for dispatcher in (on_disk, in_memory):
            dispatcher.store.client = dead
        dead.close()


def test_unreadable_parked_entries_are_set_aside_where_operators_look(make_store,
                                                                       tmp_path) -> None:
    store = make_store()
    sink = StrictSink()
    spool = DeadLetterSpool(tmp_path / "spool")
    dispatcher = DeadLetterDispatcher(sink, store, spool=spool)
    store.client.rpush(store.keys.dead_letter_outbox, "{not json", json.dumps(
        _entry("ok-behind").to_json()))
    path = spool.write([_entry("ok-spooled")])
    with path.open("ab") as f:
        f.write(b"{garbage line\n")
    assert dispatcher.retry_pending() == 2
    assert set(sink.stored) == {("ok-behind", 1), ("ok-spooled", 1)}
    report = dispatcher.aside.report()
    assert {(i.source, i.entry) for i in report.entries} == {("outbox", "{not json"),
                                                             ("spool", "{garbage line")}
    assert not any(p.name.startswith("corrupt-") for p in spool.directory.iterdir())


def test_an_outage_of_the_set_aside_keeps_the_entry_waiting(make_store) -> None:
    store = make_store()
    sink = StrictSink()
    sink.refuse = {"refused-5"}
    dead = _dead_client()
    dispatcher = DeadLetterDispatcher(sink, _over(dead, store))
    try:
        assert dispatcher.send(_entry("refused-5")) is False
        assert dispatcher.pending_in_memory == 1  # never dropped
        dispatcher.store.client = store.client
        assert dispatcher.retry_pending() == 0
        assert dispatcher.pending_in_memory == 0
        assert [i.task_id for i in dispatcher.aside.report().entries] == ["refused-5"]
    finally:
        dispatcher.store.client = dead
        dead.close()


def test_the_set_aside_list_is_bounded_and_counts_every_item(make_store, caplog,
                                                             monkeypatch) -> None:
    from jobbers_celery.deadletter import aside

    monkeypatch.setattr(aside, "KEEP", 3)
    store = make_store()
    sink = StrictSink()
    sink.refuse = {f"r-{i}" for i in range(5)}
    dispatcher = DeadLetterDispatcher(sink, store)
    with caplog.at_level(logging.ERROR, logger="jobbers.deadletter"):
        for i in range(5):
            dispatcher.send(_entry(f"r-{i}"))
    report = dispatcher.aside.report()
    assert (report.kept, report.total) == (3, 5)
    assert [i.task_id for i in report.entries] == ["r-4", "r-3", "r-2"]
    assert "oldest one was dropped" in caplog.text
    assert KEEP >= 1000


def test_the_redis_sink_stores_every_poison_case(make_store) -> None:
    store = make_store()
    sink = RedisDeadLetterSink(SimpleNamespace(store=store))  # type: ignore[arg-type]
    dispatcher = DeadLetterDispatcher(sink, store)
    assert dispatcher.send_many([*_poison(), *_normal(1)]) == [True] * (len(POISON) + 1)
    assert len(sink.entries(limit=100)) == len(POISON) + 1


def test_a_hostile_entry_holds_the_writer_briefly(make_store) -> None:
    store = make_store()
    sink = StrictSink()
    dispatcher = DeadLetterDispatcher(sink, store)
    hostile = _entry("p-huge", args=["\x00" * 1_000_000, [float("nan")] * 100_000,
                                     _nested(100_000)])
    started = time.perf_counter()
    assert dispatcher.send(hostile) is True
    assert time.perf_counter() - started < 5.0


def test_celery_jobbers_dlq_set_aside_lists_them_without_their_arguments(proj) -> None:
    """``celery -A proj jobbers dlq set-aside`` (any sink: the list is in Redis), human and
    ``--json``, control characters of an odd id escaped, never the arguments."""
    dispatcher = proj.jobbers.dead_letters
    sink = StrictSink()
    sink.refuse = {"refused-cli\x1b[2J"}
    dispatcher.sink, real = sink, dispatcher.sink
    try:
        assert dispatcher.send(_entry("refused-cli\x1b[2J")) is False
    finally:
        dispatcher.sink = real

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "jobbers", "dlq",
             "set-aside", *args], cwd=ROOT, env=subprocess_env({"NO_COLOR": "1"}),
            capture_output=True, text=True, timeout=60, check=False)

    human = cli()
    assert human.returncode == 0, human.stderr
    assert "refused-cli" in human.stdout
    assert "\x1b" not in human.stdout  # shown escaped, never obeyed by the terminal
    assert "1 set aside." in human.stdout
    assert SECRET not in human.stdout + human.stderr
    as_json = cli("--json", "--limit", "5")
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    assert (body["kept"], body["total"]) == (1, 1)
    assert body["results"][0]["task_id"] == "refused-cli\x1b[2J"
    assert body["results"][0]["waited_in"] == "send"
    assert SECRET not in as_json.stdout


_KINDS = st.sampled_from(["normal", "refused", *POISON])


@settings(max_examples=25)
@given(kinds=st.lists(_KINDS, min_size=1, max_size=12), batch=st.booleans())
def test_property_every_entry_is_written_or_set_aside_none_lost(make_store, kinds: list[str],
                                                                batch: bool) -> None:
    """Whatever mix of normal, poison and refused entries waits behind an outage, one drain
    once the sink is back writes or sets aside each of them, in any path."""
    store = make_store()
    store.client.delete(store.keys.dead_letter_outbox, store.keys.dead_letter_set_aside,
                        store.keys.dead_letter_set_aside_count)
    sink = StrictSink()
    dispatcher = DeadLetterDispatcher(sink, store)
    entries = [_entry(f"{kind}-{n}", **POISON.get(kind, {})) for n, kind in enumerate(kinds)]
    sink.refuse = {e.task_id for e in entries if e.task_id.startswith("refused")}
    sink.down = True
    if batch:
        dispatcher.send_many(entries)
    else:
        for entry in entries:
            dispatcher.send(entry)
    sink.down = False
    dispatcher.retry_pending(limit=1000)
    written = {task_id for task_id, _ in sink.stored}
    aside = [i.task_id for i in dispatcher.aside.report(limit=1000).entries]
    assert sorted([*written, *aside]) == sorted(e.task_id for e in entries)
    assert set(aside) == sink.refuse
    assert store.client.llen(store.keys.dead_letter_outbox) == 0
