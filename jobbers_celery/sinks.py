"""Dead-letter sinks: where failed, stalled and dropped tasks are written.

A sink is anything with ``write(entry)``; ``jobbers_dead_letter_sink`` names a factory that
receives the ``Jobbers`` instance. Writing must be idempotent per ``(task_id, attempt)``.
A sink may also have ``write_many(entries)`` (optional, see :class:`BatchDeadLetterSink`),
which the cleaner uses to write all the dead letters of a pass at once, and ``size()``
(optional, see :class:`SizedDeadLetterSink`), which the ``dead_letter_queue_size`` metric
gauge reports, and ``entry(task_id, attempt)`` (optional, see :class:`PayloadDeadLetterSink`):
a sink that can hand an entry back keeps the one stored copy of a dead task's payload, and
the task's record drops its own.
The dispatcher in front of it makes sure an entry is never lost silently: on failure the
entry is logged in full, parked in a Redis outbox (or in memory when Redis is down too),
and written again later.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from jobbers_celery import metrics
from jobbers_celery.records import DeadLetter
from jobbers_celery.store.keys import Keys

if TYPE_CHECKING:
    import redis

    from jobbers_celery.jobbers import Jobbers

__all__ = [
    "BatchDeadLetterSink",
    "DeadLetterDispatcher",
    "DeadLetterSink",
    "PayloadDeadLetterSink",
    "RedisDeadLetterSink",
    "SizedDeadLetterSink",
]

log = logging.getLogger("jobbers.deadletter")

#: In-memory backlog bound (only used while both the sink and Redis are unreachable).
_MAX_PENDING = 10_000
_RETRY_EVERY_S = 5.0
#: After a failed ``write_many``, entries are written one by one; after this many failures
#: in a row the sink is taken for down and the rest of the batch is parked without trying.
_GIVE_UP_AFTER = 3


@runtime_checkable
class DeadLetterSink(Protocol):
    """What every sink has. ``write`` is the only required method."""

    def write(self, entry: DeadLetter) -> None:
        """Store ``entry``; writing the same ``(task_id, attempt)`` twice keeps one entry."""


class BatchDeadLetterSink(DeadLetterSink, Protocol):
    """A sink that can also write many entries at once (found with ``getattr``, so sinks
    with ``write`` only keep working).

    ``write_many`` has the same idempotence as ``write``. It need not be atomic: when it
    raises, the dispatcher writes each entry again with ``write``, so a partly written batch
    is completed, not duplicated.
    """

    def write_many(self, entries: Sequence[DeadLetter]) -> None:
        """Store every entry of ``entries``."""


class SizedDeadLetterSink(DeadLetterSink, Protocol):
    """A sink that can tell how many entries it holds (found with ``getattr``; without it
    the ``dead_letter_queue_size`` gauge is not reported).

    Called only by the one process that reports the cluster-wide gauges, once per metric
    collection: it should be one cheap query.
    """

    def size(self) -> int:
        """How many entries the dead-letter queue holds now."""


class PayloadDeadLetterSink(DeadLetterSink, Protocol):
    """A sink that can hand an entry back (found with ``getattr``).

    Its entries then hold the one stored copy of a dead task's payload (args, kwargs, publish
    options): once an entry is written, the task's Redis record drops its own copy, and
    ``Jobbers.resubmit`` takes the payload from the entry. A sink without ``entry`` leaves
    the record's copy in place (two copies until the record expires).
    """

    def entry(self, task_id: str, attempt: int) -> DeadLetter | None:
        """The entry written for ``(task_id, attempt)``, or ``None`` if there is none."""


class RedisDeadLetterSink:
    """The default sink: a hash of JSON entries plus a time index, in the jobbers namespace."""

    def __init__(self, jobbers: Jobbers) -> None:
        self.client: redis.Redis = jobbers.store.client
        self.keys: Keys = jobbers.store.keys

    def write(self, entry: DeadLetter) -> None:
        pipe = self.client.pipeline(transaction=True)
        self._queue(pipe, entry)
        pipe.execute()

    def write_many(self, entries: Sequence[DeadLetter]) -> None:
        """One round trip for all ``entries``: the per-entry commands of ``write`` in one
        pipeline, without MULTI (each command is idempotent on its own, and a batch cut
        short is written again entry by entry)."""
        if not entries:
            return
        pipe = self.client.pipeline(transaction=False)
        for entry in entries:
            self._queue(pipe, entry)
        pipe.execute()

    def _queue(self, pipe: redis.client.Pipeline, entry: DeadLetter) -> None:
        member = f"{entry.task_id}:{entry.attempt}"
        pipe.hsetnx(self.keys.dead_letters, member, json.dumps(entry.to_json(), default=str))
        pipe.zadd(self.keys.dead_letter_index, {member: entry.failed_at.timestamp()}, nx=True)

    def size(self) -> int:
        """Entries stored (one ``HLEN``)."""
        return int(self.client.hlen(self.keys.dead_letters))

    def entry(self, task_id: str, attempt: int) -> DeadLetter | None:
        """The entry of ``(task_id, attempt)`` (one ``HGET``), ``None`` if absent."""
        raw = cast("str | None", self.client.hget(self.keys.dead_letters,
                                                  f"{task_id}:{attempt}"))
        return DeadLetter.from_json(json.loads(raw)) if raw else None

    def entries(self, limit: int = 100) -> list[DeadLetter]:
        """Newest first."""
        members = cast("list[str]",
                       self.client.zrevrange(self.keys.dead_letter_index, 0, limit - 1))
        if not members:
            return []
        raw = cast("list[str | None]", self.client.hmget(self.keys.dead_letters, members))
        return [DeadLetter.from_json(json.loads(r)) for r in raw if r]


class DeadLetterDispatcher:
    """Sends entries to the sink, keeping and retrying the ones it could not write.

    ``written``: called with the entries the sink took (after each write or batch; an
    exception it raises is logged, never lost entries): ``Jobbers`` drops the records'
    copies of the payloads there when the sink keeps them (:class:`PayloadDeadLetterSink`).
    """

    def __init__(self, sink: DeadLetterSink, client: redis.Redis, keys: Keys,
                 written: Callable[[Sequence[DeadLetter]], None] | None = None) -> None:
        self.sink = sink
        self.client = client
        self.keys = keys
        self._written = written
        self._pending: collections.deque[DeadLetter] = collections.deque(maxlen=_MAX_PENDING)
        self._lock = threading.Lock()
        self._retrier: threading.Thread | None = None

    def send(self, entry: DeadLetter) -> bool:
        """Write ``entry``; ``False`` if it was parked for a later retry."""
        metrics.dead_lettered((entry,))
        try:
            self.sink.write(entry)
        except Exception:
            log.exception(
                "dead-letter sink failed; entry kept for retry: %s",
                json.dumps(entry.to_json(), default=str),
            )
            self._park(entry)
            return False
        self._after_write([entry])
        return True

    def _after_write(self, entries: Sequence[DeadLetter]) -> None:
        if self._written is None or not entries:
            return
        try:
            self._written(entries)
        except Exception:  # the entries are written; only a copy stays behind
            log.warning("could not drop the records' copies of %d dead-lettered payload(s); "
                        "they expire with the records", len(entries), exc_info=True)

    def send_many(self, entries: Sequence[DeadLetter]) -> list[bool]:
        """Write ``entries`` at once when the sink has ``write_many`` (one at a time with
        ``write`` otherwise); per entry, ``False`` if it was parked for a later retry.

        When ``write_many`` raises, the entries go through the per-entry path: written one
        by one, and the ones that fail are logged in full and parked, so nothing is lost.
        """
        batch = list(entries)
        if not batch:
            return []
        metrics.dead_lettered(batch)
        write_many: Any = getattr(self.sink, "write_many", None)
        if callable(write_many):
            try:
                write_many(batch)
            except Exception:
                log.warning("dead-letter sink could not write %d entries at once; "
                            "writing them one at a time", len(batch), exc_info=True)
            else:
                self._after_write(batch)
                return [True] * len(batch)
        sent: list[bool] = []
        failed: list[DeadLetter] = []
        in_a_row = 0
        for entry in batch:
            if in_a_row >= _GIVE_UP_AFTER:
                # the sink looks down: do not wait for it once per entry
                log.error("dead-letter sink unavailable; entry kept for retry: %s",
                          json.dumps(entry.to_json(), default=str))
            else:
                try:
                    self.sink.write(entry)
                    sent.append(True)
                    in_a_row = 0
                    continue
                except Exception:
                    log.exception("dead-letter sink failed; entry kept for retry: %s",
                                  json.dumps(entry.to_json(), default=str))
                    in_a_row += 1
            failed.append(entry)
            sent.append(False)
        self._after_write([e for e, ok in zip(batch, sent, strict=True) if ok])
        if failed:
            self._park_many(failed)
        return sent

    def _park_many(self, entries: list[DeadLetter]) -> None:
        """Park ``entries`` in the Redis outbox with one command (in memory if that fails)."""
        try:
            self.client.rpush(self.keys.dead_letter_outbox,
                              *(json.dumps(e.to_json(), default=str) for e in entries))
            return
        except Exception:
            log.exception("Redis outbox unavailable too; keeping %d dead letter(s) in memory",
                          len(entries))
        for entry in entries:
            self._keep_in_memory(entry)

    def _park(self, entry: DeadLetter) -> None:
        try:
            self.client.rpush(self.keys.dead_letter_outbox,
                              json.dumps(entry.to_json(), default=str))
            return
        except Exception:
            log.exception("Redis outbox unavailable too; keeping dead letter %s:%s in memory",
                          entry.task_id, entry.attempt)
        self._keep_in_memory(entry)

    def _keep_in_memory(self, entry: DeadLetter) -> None:
        with self._lock:
            if len(self._pending) == self._pending.maxlen:
                dropped = self._pending[0]
                log.error("dead-letter memory backlog full; oldest entry only in the log above: "
                          "%s:%s", dropped.task_id, dropped.attempt)
            self._pending.append(entry)
            if self._retrier is None or not self._retrier.is_alive():
                self._retrier = threading.Thread(target=self._retry_loop, daemon=True,
                                                 name="jobbers-dlq-retry")
                self._retrier.start()

    def _retry_loop(self) -> None:
        stop = threading.Event()
        while self._pending:
            stop.wait(_RETRY_EVERY_S)
            self.retry_pending()

    def retry_pending(self, limit: int = 100) -> int:
        """Write parked entries again (memory first, then the Redis outbox); returns written."""
        done: list[DeadLetter] = []
        try:
            self._retry_pending(limit, done)
        finally:
            self._after_write(done)
        return len(done)

    def _retry_pending(self, limit: int, done: list[DeadLetter]) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    break
                entry = self._pending[0]
            try:
                self.sink.write(entry)
            except Exception:  # noqa: BLE001 - still failing: keep it, try again later
                return
            with self._lock:
                if self._pending and self._pending[0] is entry:
                    self._pending.popleft()
            done.append(entry)
        for _ in range(limit):
            try:
                raw = cast("str | None", self.client.lpop(self.keys.dead_letter_outbox))
            except Exception:  # noqa: BLE001 - Redis down: the outbox waits for it
                return
            if raw is None:
                break
            entry = DeadLetter.from_json(json.loads(raw))
            try:
                self.sink.write(entry)
            except Exception:  # noqa: BLE001 - logged; the entry goes back to the outbox
                log.warning("dead-letter sink still failing; %s:%s stays in the outbox",
                            entry.task_id, entry.attempt)
                try:
                    self.client.lpush(self.keys.dead_letter_outbox, raw)
                except Exception:  # noqa: BLE001 - popped but not pushed back: keep it in memory
                    self._park(entry)
                return
            done.append(entry)

    @property
    def pending_in_memory(self) -> int:
        return len(self._pending)
