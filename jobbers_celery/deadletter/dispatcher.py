"""The dead-letter dispatcher: every entry reaches the sink, however long that takes.

One the sink did not take is parked in the Redis outbox, or, when Redis is unreachable too,
in the local spool (a directory, see :mod:`jobbers_celery.deadletter.spool`), in memory only
when the disk refuses as well, and written again later, also by another process. An entry
the sink refuses for a reason of its own (see
:func:`~jobbers_celery.deadletter.errors.refused_for_itself`) is tried again in its storable
form (:func:`jobbers_celery.core.storable.storable`), and set aside when still refused (see
:mod:`jobbers_celery.deadletter.aside`): the entries behind it are written, nothing waits on
it. What it logs of an entry is its task id, name, attempt and reason, and where it was kept:
never its arguments, checkpoint or exception message, and the sink's error with any of those
values, and any credential (a URL's password, a token), taken out
(:func:`~jobbers_celery.deadletter.errors.describe_error`).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.storable import is_storable, parked_json, storable_form
from jobbers_celery.deadletter.aside import AsideStore, SetAsideList
from jobbers_celery.deadletter.errors import describe_error, refused_for_itself
from jobbers_celery.deadletter.sink import DeadLetterSink
from jobbers_celery.deadletter.spool import DeadLetterSpool
from jobbers_celery.telemetry import metrics

__all__ = ["DeadLetterDispatcher", "close_all"]

log = escaped_logger("jobbers.deadletter")

#: In-memory backlog bound (only used while the sink, Redis and the spool all refuse).
_MAX_PENDING = 10_000
_RETRY_EVERY_S = 5.0
#: After a failed ``write_many``, entries are written one by one; after this many failures
#: in a row the sink is taken for down and the rest of the batch is parked without trying.
_GIVE_UP_AFTER = 3
_GAVE_UP = f"not tried: the sink failed {_GIVE_UP_AFTER} times in a row"


class DeadLetterDispatcher:
    """Sends entries to the sink, keeping and retrying the ones it could not write.

    An entry the sink refuses is parked in the Redis outbox; when Redis refuses too, in
    ``spool`` (a :class:`~jobbers_celery.deadletter.spool.DeadLetterSpool`, durable on local disk);
    when that fails as well (or there is no spool), in this process's memory. The
    workers' housekeeping and a retry thread (started while something waits in memory or
    in the spool) write them again: memory first, then the spool (what the sink still
    refuses moves on to the outbox once Redis answers), then the outbox.

    An entry the sink refuses for a reason of its own
    (:func:`~jobbers_celery.deadletter.errors.refused_for_itself`), also in its storable form,
    is set aside (:class:`~jobbers_celery.deadletter.aside.SetAsideList`) and the ones behind
    it go on; when Redis refuses the set-aside too, it waits as any other.

    ``store``: where the outbox and the set-aside list are (the store's dead-letter part:
    the Redis store, or the in-memory one of :mod:`jobbers_celery.testing`).

    ``written``: called with the entries the sink took as they were (after each write or
    batch; an exception it raises is logged, never lost entries): ``Jobbers`` drops the
    records' copies of the payloads there when the sink keeps them
    (:class:`~jobbers_celery.deadletter.sink.PayloadDeadLetterSink`). An entry stored altered
    is left out: its record keeps the payload as it was.
    """

    def __init__(self, sink: DeadLetterSink, store: AsideStore,
                 written: Callable[[Sequence[DeadLetter]], None] | None = None,
                 spool: DeadLetterSpool | None = None) -> None:
        self.sink = sink
        self.store = store
        self.spool = spool
        self._written = written
        self.aside = SetAsideList(store)
        if spool is not None:
            spool.on_unreadable = self._set_aside_lines
        self._pending: collections.deque[DeadLetter] = collections.deque(maxlen=_MAX_PENDING)
        self._lock = threading.Lock()
        self._retrier: threading.Thread | None = None
        self._stop = threading.Event()
        _open.add(self)

    # ------------------------------------------------------------------ sending
    def send(self, entry: DeadLetter) -> bool:
        """Write ``entry``; ``False`` if it was parked for a later retry."""
        metrics.dead_lettered((entry,))
        error = self._write(entry)
        if error is None:
            self._after_write([entry])
            self._kick()
            return True
        if error.refused and self._set_aside(_dumps(entry), error.text, "send", entry):
            self._kick()
            return False
        where = self._park([entry])
        _log_kept(entry, error.text, where)
        return False

    def _write(self, entry: DeadLetter) -> _Refusal | None:
        """Write ``entry``, and its storable form when the sink refuses it for a reason of
        its own; ``None`` once written, else why not (and whether the entry is to blame)."""
        try:
            self.sink.write(entry)
        except Exception as exc:  # noqa: BLE001 - described without the payload
            if not refused_for_itself(exc):
                return _Refusal(describe_error(exc, (entry,)), refused=False)
            first = exc
        else:
            return None
        shown = storable_form(entry)
        if shown is entry:
            return _Refusal(describe_error(first, (entry,)), refused=True)
        try:
            self.sink.write(shown)
        except Exception as exc:  # noqa: BLE001 - described without the payload
            return _Refusal(describe_error(exc, (entry, shown)),
                            refused=refused_for_itself(exc))
        return None

    def _set_aside(self, raw: str | None, why: str, source: str,
                   entry: DeadLetter | None = None) -> bool:
        """Keep ``raw`` in the set-aside list with ``why``; whether Redis took it."""
        try:
            self.aside.add(raw, why, source, entry)
        except Exception as exc:  # noqa: BLE001 - Redis down: the entry waits as the others
            log.warning("could not set aside a dead letter (%s); it waits",
                        describe_error(exc, (entry,) if entry else ()))
            return False
        who = (f"dead letter {entry.name}[{entry.task_id}] attempt {entry.attempt} "
               f"({entry.reason})" if entry is not None else "an unreadable dead letter")
        log.error("%s set aside in %s, never retried: %s", who,
                  self.store.keys.dead_letter_set_aside, why)
        return True

    def send_many(self, entries: Sequence[DeadLetter]) -> list[bool]:
        """Write ``entries`` at once when the sink has ``write_many`` (one at a time with
        ``write`` otherwise); per entry, ``False`` if it was parked for a later retry.

        When ``write_many`` raises, the entries go through the per-entry path: written one
        by one, and the ones that fail are parked (and logged without their payloads), so
        nothing is lost.
        """
        batch = list(entries)
        if not batch:
            return []
        metrics.dead_lettered(batch)
        write_many: Any = getattr(self.sink, "write_many", None)
        if callable(write_many):
            try:
                write_many(batch)
            except Exception as exc:  # noqa: BLE001 - logged, without the payloads
                log.warning("dead-letter sink could not write %d entries at once (%s); "
                            "writing them one at a time", len(batch),
                            describe_error(exc, batch))
            else:
                self._after_write(batch)
                self._kick()
                return [True] * len(batch)
        sent: list[bool] = []
        failed: list[tuple[DeadLetter, str]] = []
        in_a_row = 0
        for entry in batch:
            if in_a_row >= _GIVE_UP_AFTER:
                # the sink looks down: do not wait for it once per entry
                failed.append((entry, _GAVE_UP))
                sent.append(False)
                continue
            error = self._write(entry)
            sent.append(error is None)
            if error is None:
                in_a_row = 0
            elif error.refused:  # the sink answered: it is up
                in_a_row = 0
                if not self._set_aside(_dumps(entry), error.text, "send", entry):
                    failed.append((entry, error.text))
            else:
                failed.append((entry, error.text))
                in_a_row += 1
        self._after_write([e for e, ok in zip(batch, sent, strict=True) if ok])
        if failed:
            where = self._park([entry for entry, _ in failed])
            for entry, why in failed:
                _log_kept(entry, why, where)
        return sent

    def _after_write(self, entries: Sequence[DeadLetter]) -> None:
        if self._written is None or not entries:
            return
        entries = [e for e in entries if is_storable(e)]  # an altered one keeps its record's
        if not entries:
            return
        try:
            self._written(entries)
        except Exception:  # the entries are written; only a copy stays behind
            log.warning("could not drop the records' copies of %d dead-lettered payload(s); "
                        "they expire with the records", len(entries), exc_info=True)

    # ------------------------------------------------------------------ parking
    def _park(self, entries: list[DeadLetter]) -> str:
        """Keep ``entries`` (outbox, else spool, else memory); where they went, for the log."""
        where = self._park_durably(entries)
        if where is not None:
            return where
        for entry in entries:
            self._keep_in_memory(entry)
        return "this process's memory only (lost if it exits before the sink or Redis is back)"

    def _park_durably(self, entries: Sequence[DeadLetter]) -> str | None:
        """The outbox (one ``RPUSH``), else the spool; ``None`` if both refused."""
        try:
            self.store.outbox_push([_dumps(e) for e in entries])
            return f"the Redis outbox {self.store.keys.dead_letter_outbox}"
        except Exception as exc:  # noqa: BLE001 - logged with the spool's outcome
            outbox_error = describe_error(exc, entries)
        if self.spool is None:
            log.error("Redis outbox unavailable too (%s)", outbox_error)
            return None
        try:
            path = self.spool.write(entries)
        except Exception as exc:  # noqa: BLE001 - logged, without the payloads
            log.error("Redis outbox unavailable too (%s) and the dead-letter spool %s refused "
                      "(%s)", outbox_error, self.spool.directory, describe_error(exc, entries))
            return None
        self._ensure_retrier()
        return f"the spool file {path} (Redis outbox unavailable: {outbox_error})"

    def _keep_in_memory(self, entry: DeadLetter) -> None:
        with self._lock:
            if len(self._pending) == self._pending.maxlen:
                dropped = self._pending[0]
                log.error("dead-letter memory backlog full; dead letter %s[%s] attempt %s "
                          "(%s) dropped from it and lost", dropped.name, dropped.task_id,
                          dropped.attempt, dropped.reason)
            self._pending.append(entry)
        self._ensure_retrier()

    def _ensure_retrier(self) -> None:
        with self._lock:
            if self._stop.is_set() or (self._retrier is not None and self._retrier.is_alive()):
                return
            self._retrier = threading.Thread(target=self._retry_loop, daemon=True,
                                             name="jobbers-dlq-retry")
            self._retrier.start()

    def _kick(self) -> None:
        """After a successful write: the sink works, so start draining a spool left by this
        process or another one on this machine (one directory listing)."""
        if self.spool is None or (self._retrier is not None and self._retrier.is_alive()):
            return
        try:
            waiting = self.spool.has_entries()
        except OSError:
            return
        if waiting:
            self._ensure_retrier()

    def _retry_loop(self) -> None:
        while not self._stop.wait(_RETRY_EVERY_S):
            try:
                self.retry_pending()
            except Exception:
                log.exception("dead-letter retry failed; trying again")
            if not self._pending and not self._spool_waiting():
                return

    def _spool_waiting(self) -> bool:
        if self.spool is None:
            return False
        try:
            return self.spool.has_entries()
        except OSError:
            return True

    # ------------------------------------------------------------------ retrying
    def retry_pending(self, limit: int = 100) -> int:
        """Write parked entries again (memory, then the spool, then the Redis outbox);
        returns how many the sink took."""
        done: list[DeadLetter] = []
        try:
            sink_up = self._retry_memory(done)
            if self.spool is not None:
                sink_up = self._drain_spool(sink_up, limit, done)
            if sink_up:
                self._drain_outbox(limit, done)
        finally:
            self._after_write(done)
            if done:
                log.info("dead-letter sink took %d parked entr%s: %s", len(done),
                         "y" if len(done) == 1 else "ies",
                         ", ".join(f"{e.name}[{e.task_id}] attempt {e.attempt}"
                                   for e in done[:20]) + (" ..." if len(done) > 20 else ""))
        return len(done)

    def _retry_memory(self, done: list[DeadLetter]) -> bool:
        """Entries kept in memory: to the sink, else somewhere durable. Whether the sink
        still looks up."""
        with self._lock:
            waiting = list(self._pending)
        sink_up = True
        for entry in waiting:
            if sink_up:
                error = self._write(entry)
                if error is None or (error.refused and self._set_aside(
                        _dumps(entry), error.text, "memory", entry)):
                    self._forget(entry)
                    if error is None:
                        done.append(entry)
                    continue
                sink_up = error.refused  # still failing: keep it, try again later
            where = self._park_durably((entry,))
            if where is None:
                break  # neither Redis nor the disk: it stays in memory
            self._forget(entry)
            log.warning("dead letter %s[%s] attempt %s (%s) moved from memory to %s",
                        entry.name, entry.task_id, entry.attempt, entry.reason, where)
        return sink_up

    def _forget(self, entry: DeadLetter) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._pending.remove(entry)

    def _drain_spool(self, sink_up: bool, limit: int, done: list[DeadLetter]) -> bool:
        """Spool files, oldest first, to the sink; what it does not take goes on to the
        outbox when Redis answers (every machine's workers drain that). A file is removed
        once all its entries are taken; one cut short is replaced by the entries left."""
        assert self.spool is not None
        try:
            paths = self.spool.paths()
        except OSError:
            log.exception("could not list the dead-letter spool %s", self.spool.directory)
            return sink_up
        handled = 0
        for path in paths:
            if handled >= limit:
                break
            try:
                with self.spool.claim(path) as claimed:
                    if claimed is None:
                        continue
                    handled += len(claimed.entries)
                    left = list(claimed.entries)
                    if sink_up and left:
                        sink_up = self._write_some(left, done)
                    if left and self._to_outbox(left):
                        log.info("%d dead letter(s) of spool file %s moved to the Redis "
                                 "outbox", len(left), path)
                        left = []
                    if left and len(left) == len(claimed.entries):
                        continue  # nothing taken: the file stays as it is
                    self.spool.done(claimed, left)
            except Exception:
                log.exception("could not drain dead-letter spool file %s; it stays", path)
        return sink_up

    def _write_some(self, left: list[DeadLetter], done: list[DeadLetter]) -> bool:
        """Write ``left`` (in place: what the sink took is removed from it); whether the sink
        took everything."""
        write_many: Any = getattr(self.sink, "write_many", None)
        if callable(write_many) and len(left) > 1:
            with contextlib.suppress(Exception):  # one at a time below, to the first failure
                write_many(left)
                done.extend(left)
                left.clear()
                return True
        kept: list[DeadLetter] = []
        up = True
        while left:
            entry = left.pop(0)
            error = self._write(entry)
            if error is None:
                done.append(entry)
            elif not (error.refused and self._set_aside(_dumps(entry), error.text, "spool",
                                                        entry)):
                kept.append(entry)
                if not error.refused:  # the sink is down: the rest waits
                    up = False
                    break
        left[:0] = kept
        return up

    def _to_outbox(self, entries: Sequence[DeadLetter]) -> bool:
        try:
            self.store.outbox_push([_dumps(e) for e in entries])
        except Exception:  # noqa: BLE001 - Redis down: the entries stay in the spool
            return False
        return True

    def _drain_outbox(self, limit: int, done: list[DeadLetter]) -> None:
        """Entries of the Redis outbox, head first. An entry leaves the outbox only once the
        sink took it or it was set aside (``LINDEX`` then ``LREM``): a process that dies
        meanwhile loses nothing, and two workers draining at once write an entry twice at
        worst (sinks are idempotent). The sink down: the head entry and the rest wait, in
        order; the head entry refused for itself: it is set aside, the next one follows."""
        for _ in range(limit):
            try:
                raw = self.store.outbox_head()
            except Exception:  # noqa: BLE001 - Redis down: the outbox waits for it
                return
            if raw is None:
                return
            try:
                entry = DeadLetter.from_json(json.loads(raw))
            except Exception:  # noqa: BLE001 - unreadable: set aside, never retried
                if not self._set_aside_outbox(raw):
                    return
                continue
            error = self._write(entry)
            if error is not None and not error.refused:
                log.warning("dead-letter sink still failing (%s); dead letter %s[%s] attempt %s "
                            "stays in the outbox", error.text, entry.name,
                            entry.task_id, entry.attempt)
                return
            if error is not None:
                if not self._set_aside(raw, error.text, "outbox", entry):
                    return
            else:
                done.append(entry)
            try:
                self.store.outbox_remove(raw)
            except Exception:  # noqa: BLE001 - written; it is written again later (idempotent)
                return

    def _set_aside_lines(self, lines: Sequence[bytes], path: os.PathLike[str]) -> bool:
        """Unreadable lines of a spool file to the set-aside list; whether all went."""
        return all(self._set_aside(line.decode("utf-8", "replace"),
                                   f"unreadable: a line of spool file {path}", "spool")
                   for line in lines)

    def _set_aside_outbox(self, raw: str) -> bool:
        key = self.store.keys.dead_letter_outbox
        if self._set_aside(raw, "unreadable: not a dead-letter entry's JSON", "outbox"):
            try:
                self.store.outbox_remove(raw)
            except Exception:  # noqa: BLE001 - set aside twice at worst, never lost
                return False
            return True
        if self.spool is None:
            log.error("unreadable entry at the head of %s; it stays there", key)
            return False
        try:
            target = self.spool.set_aside([raw.encode()], "outbox.jsonl")
            self.store.outbox_remove(raw)
        except Exception:
            log.exception("could not set aside an unreadable entry of %s; it stays there", key)
            return False
        log.error("unreadable entry of %s set aside in %s (not retried)", key, target)
        return True

    # ------------------------------------------------------------------ exit
    def close(self) -> None:
        """At process exit: entries still only in memory go to the sink or somewhere
        durable if they can; the ones that cannot are logged (without payloads) as lost.
        Idempotent; the spool and the outbox need nothing (they outlive the process)."""
        self._stop.set()
        done: list[DeadLetter] = []
        try:
            self._retry_memory(done)
        finally:
            self._after_write(done)
        with self._lock:
            lost = list(self._pending)
            self._pending.clear()
        for entry in lost:
            log.error("dead letter %s[%s] attempt %s (%s) lost: the sink, the Redis outbox and "
                      "the spool all refused it until this process exited", entry.name,
                      entry.task_id, entry.attempt, entry.reason)

    @property
    def pending_in_memory(self) -> int:
        return len(self._pending)


_open: weakref.WeakSet[DeadLetterDispatcher] = weakref.WeakSet()


def close_all() -> None:
    """:meth:`DeadLetterDispatcher.close` every dispatcher of this process (at exit: the
    worker's and its pool children's shutdown signals, and ``atexit``)."""
    for dispatcher in list(_open):
        try:
            dispatcher.close()
        except Exception:
            log.exception("could not settle the dead letters kept in memory")


atexit.register(close_all)


def _after_fork_in_child() -> None:
    """A forked child (a prefork pool process) starts with its own lock and no retry thread,
    and leaves the entries the parent keeps in memory to the parent (two copies would be
    written twice, or reported lost by whichever exits first)."""
    for dispatcher in list(_open):
        dispatcher._lock = threading.Lock()
        dispatcher._retrier = None
        dispatcher._pending.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True, slots=True)
class _Refusal:
    """Why the sink did not take an entry: ``text`` (scrubbed), and whether the entry itself
    is to blame (``refused``) rather than the sink being down."""

    text: str
    refused: bool


_dumps = parked_json


def _log_kept(entry: DeadLetter, error: str, where: str) -> None:
    log.error("dead letter %s[%s] attempt %s (%s) not written: %s; kept in %s",
              entry.name, entry.task_id, entry.attempt, entry.reason, error, where)
