"""The dead-letter queue's Redis commands: the default sink's entries (a hash of JSON under
``<task id>:<attempt>`` plus a time index), the dispatcher's outbox and the set-aside list.

Why here: the store is the only code that imports redis; the dead-letter wing reads and
writes the JSON, these functions move the text. :class:`RedisDeadLetters` is the part on
its own (what the dispatcher is built with: a client and the dataset's keys); ``RedisStore``
binds the same functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, cast

import redis

from jobbers_celery.store.keys import Keys

__all__ = ["Connection", "RedisDeadLetters", "entries_matching", "entry_count", "entry_text",
           "entry_texts", "outbox_head", "outbox_push", "outbox_remove", "put_entries",
           "remove_entries", "set_aside_push", "set_aside_read"]


class Connection(Protocol):
    """What the functions use: a client and the dataset's keys (``RedisStore``, the
    dispatcher, the set-aside list)."""

    client: redis.Redis
    keys: Keys


def put_entries(s: Connection, entries: Sequence[tuple[str, str, float]], *,
                atomic: bool) -> None:
    """``(member, JSON, failed at)`` each, kept if absent, in one round trip: one MULTI
    (``atomic``), or a plain pipeline (each command is idempotent on its own, and a batch
    cut short is written again entry by entry)."""
    if not entries:
        return
    pipe = s.client.pipeline(transaction=atomic)
    for member, text, at in entries:
        pipe.hsetnx(s.keys.dead_letters, member, text)
        pipe.zadd(s.keys.dead_letter_index, {member: at}, nx=True)
    pipe.execute()


def entry_count(s: Connection) -> int:
    """Entries stored (one ``HLEN``)."""
    return int(s.client.hlen(s.keys.dead_letters))


def entry_text(s: Connection, member: str) -> str | None:
    """The JSON of one entry (one ``HGET``)."""
    return cast("str | None", s.client.hget(s.keys.dead_letters, member))


def entry_texts(s: Connection, offset: int, count: int) -> list[str | None]:
    """The JSON of the entries ``offset`` to ``offset + count - 1``, newest first (two
    round trips; ``None`` for an index entry without its entry), ``[]`` past the end."""
    members = cast("list[str]", s.client.zrevrange(s.keys.dead_letter_index, offset,
                                                    offset + count - 1))
    if not members:
        return []
    return cast("list[str | None]", s.client.hmget(s.keys.dead_letters, members))


def entries_matching(s: Connection, pattern: str) -> Iterator[tuple[str, str]]:
    """``(member, JSON)`` of the members matching the glob ``pattern`` (``HSCAN``)."""
    return cast("Iterator[tuple[str, str]]",
                s.client.hscan_iter(s.keys.dead_letters, match=pattern, count=1000))


def remove_entries(s: Connection, members: Sequence[str]) -> int:
    """Remove ``members`` and their index entries (one MULTI); how many were there."""
    if not members:
        return 0
    pipe = s.client.pipeline(transaction=True)
    pipe.hdel(s.keys.dead_letters, *members)
    pipe.zrem(s.keys.dead_letter_index, *members)
    removed, _ = pipe.execute()
    return int(removed)


def outbox_push(s: Connection, texts: Sequence[str]) -> None:
    """Park ``texts`` at the tail of the outbox (one ``RPUSH``)."""
    s.client.rpush(s.keys.dead_letter_outbox, *texts)


def outbox_head(s: Connection) -> str | None:
    """The outbox's head (``LINDEX``), left in place."""
    return cast("str | None", s.client.lindex(s.keys.dead_letter_outbox, 0))


def outbox_remove(s: Connection, text: str) -> None:
    """Remove one ``text`` from the outbox (``LREM``), once written or set aside."""
    s.client.lrem(s.keys.dead_letter_outbox, 1, text)


def set_aside_push(s: Connection, item: str, keep: int) -> int:
    """Add ``item`` to the set-aside list, keep the newest ``keep``, count it (one MULTI);
    the list's length before trimming."""
    pipe = s.client.pipeline(transaction=True)
    pipe.lpush(s.keys.dead_letter_set_aside, item)
    pipe.ltrim(s.keys.dead_letter_set_aside, 0, keep - 1)
    pipe.incr(s.keys.dead_letter_set_aside_count)
    length, _, _ = pipe.execute()
    return int(length)


def set_aside_read(s: Connection, limit: int) -> tuple[list[str], int, int]:
    """The newest ``limit`` items, how many are kept, how many were ever added (one
    round trip)."""
    pipe = s.client.pipeline(transaction=False)
    pipe.lrange(s.keys.dead_letter_set_aside, 0, max(limit, 1) - 1)
    pipe.llen(s.keys.dead_letter_set_aside)
    pipe.get(s.keys.dead_letter_set_aside_count)
    items, kept, total = pipe.execute()
    return cast("list[str]", items)[:limit], int(kept), int(total or 0)


class RedisDeadLetters:
    """The dead-letter part over ``client`` in the dataset of ``keys``."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    put_entries = put_entries
    entry_count = entry_count
    entry_text = entry_text
    entry_texts = entry_texts
    entries_matching = entries_matching
    remove_entries = remove_entries
    outbox_push = outbox_push
    outbox_head = outbox_head
    outbox_remove = outbox_remove
    set_aside_push = set_aside_push
    set_aside_read = set_aside_read
