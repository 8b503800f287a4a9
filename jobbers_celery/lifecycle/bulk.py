"""Bulk publish: the records of many members written a batch at a time, each member's
message still held until its record exists.

Why: a single publish records its ``submitted`` step (one store round trip) before its message
goes; a group of 10,000 members paid 10,000 round trips, and published at 0.54-0.65 of plain
Celery's rate. A :class:`PublishBatch` takes the members of one bulk publish (the worker
layer opens one around a group's publish, see :mod:`jobbers_celery.worker.bulk`): each
member's step, built by the recorder exactly as for a single publish
(:meth:`~jobbers_celery.lifecycle.recorder.Recorder.publish` with ``batch``), and its message,
held. Every ``size`` members (or :data:`CUT_BYTES` of their payloads, whichever comes
first) the steps held are written in one store call
(:meth:`~jobbers_celery.store.StepStore.submit_many`: the same script, pipelined), without
waiting for the replies; at the next cut (or at the end) the replies are read, the headers
stamped as a single publish stamps them, and the messages published, in order. So:

- a member's message never reaches the broker before its step's reply was read;
- a step refused (a duplicate id) stamps its headers as a refused single publish does;
- a unique task's member whose key another copy holds (its step refused ``duplicate:<id>``)
  sends no message; the batch's :data:`Refused` is told of it (the worker layer marks its
  result REVOKED, so that the group's result and a chord's callback do not wait for it);
- a member under fair shares (:func:`fair_member`) whose step parked it (its key had no
  room) sends no message, as a single publish parked: the release pass publishes it from
  its record (its canvas options with it) once its key has room;
- a batch whose write failed (the store unreachable) lets its messages go unrecorded, as a
  single publish whose step failed does: the worker records the submission at the start;
- a cut's messages go to the broker through one :data:`Sender` call (the worker layer's
  writes them in one kombu publish batch: on a Redis broker one pipelined write, where
  Celery's loop makes a round trip per message);
- a message whose publish raises stops the batch: the records of it and of the members held
  after it end ``dropped`` at once (:meth:`~jobbers_celery.lifecycle.recorder.Recorder.never_sent`),
  the later members are never published (as in Celery, whose loop stops at the raise), and
  the exception reaches the caller.

Between a cut and the next, the store works on one batch while the publisher builds the next
members: the store's time per member is not added to the publish's. Only the last batch's is:
so big members (a ``chunks`` message holds its whole chunk, and its step stores it) are cut
by their bytes too, which keeps that last batch small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, Protocol

from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import duplicate_of
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.store import SentSteps, StepStore, Submission

__all__ = ["CUT_BYTES", "Message", "PublishBatch", "Recording", "Refused", "SendStopped",
           "Sender", "current", "enter", "fair_member", "leave", "member_fair", "stamp_published"]

log = escaped_logger("jobbers.lifecycle")

#: Payload bytes of the steps held that make a cut, however few they are (see the module's
#: docstring): 100 ``chunks`` messages of 100 pairs (1.8 KB each) go in two calls, not one
#: at the end; a group's usual members (a few hundred bytes each) are still cut by count.
CUT_BYTES = 128 * 1024

#: A publish's message: (body, the producer's ``publish`` keyword arguments).
Message = tuple[Any, dict[str, Any]]


class SendStopped(Exception):
    """Raised by a :data:`Sender`: the messages from ``index`` on are not known to have
    reached the broker (``error``: what stopped them, which the caller gets)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


#: Publishes a cut's messages in order (the worker layer's: one kombu publish batch, see
#: :mod:`jobbers_celery.worker.bulk`); raises :class:`SendStopped` at an error.
Sender = Callable[[list[Message]], None]

#: Told of a member not sent because a unique task's copy holds its key: (its message, the
#: holder's id). Raises nothing: the worker layer's logs what fails.
Refused = Callable[[Message, str], None]


class Recording(Protocol):
    """What a batch uses of the recorder that built a step (the recorder: this module sits
    below it)."""

    @property
    def store(self) -> StepStore: ...

    def never_sent(self, task_id: str, exc: BaseException) -> object: ...

    def never_released(self, task_id: str, exc: BaseException) -> object: ...


#: A held step: its recorder, the step, the headers to stamp (the message's own dict).
_Held = tuple[Recording, Submission, dict[str, Any]]


def stamp_published(headers: dict[str, Any], now: int, epoch: str | None) -> None:
    """Stamp a recorded publish's headers (a single publish's and a batched one's alike):
    first enqueue and this publish at Redis time ``now``, and the dataset's ``epoch`` if the
    step applied (a worker that finds no record for a message carrying it knows the record
    was removed on purpose)."""
    headers.setdefault(pl.HEADER_ENQUEUED_AT, now)
    headers[pl.HEADER_PUBLISHED_AT] = now
    if epoch:
        headers[pl.HEADER_EPOCH] = epoch


class _Segment:
    """The steps and messages held between two cuts: written at one, finished at the next."""

    __slots__ = ("held", "messages", "sent")

    def __init__(self, held: list[_Held], messages: list[Message]) -> None:
        self.held = held
        self.messages = messages
        self.sent: list[tuple[list[_Held], SentSteps | Exception]] = []

    def write(self) -> None:
        """Send the steps, one call per store (members of one app share one), replies not
        read."""
        by_store: dict[int, tuple[StepStore, list[_Held]]] = {}
        for item in self.held:
            store = item[0].store
            by_store.setdefault(id(store), (store, []))[1].append(item)
        for store, items in by_store.values():
            try:
                sent: SentSteps | Exception = store.submit_many([sub for _, sub, _ in items])
            except Exception as exc:  # noqa: BLE001 - as a single publish's failed step
                sent = exc
            self.sent.append((items, sent))

    def finish(self, send: Sender, refused: Refused | None = None) -> None:
        """Read the replies, stamp the headers, publish the messages in order; ``refused``
        is told of each member not sent because a unique task's copy holds its key."""
        made: dict[int, tuple[Recording, str]] = {}  # id(headers) -> a record this batch made
        fair: dict[int, tuple[Recording, str, SentSteps]] = {}  # id(headers) -> a member
        # under fair shares whose step applied (on its way, or parked)
        dup: set[int] = set()  # id(headers) of members a unique task's copy holds, or
        # parked under fair shares (their key had no room): no message is sent
        holders: dict[int, str] = {}  # id(headers) -> the holder's id, for those copies
        for items, sent in self.sent:
            results = ([sent] * len(items) if isinstance(sent, Exception)
                       else sent.results())
            failed: list[tuple[str, Exception]] = []
            for (recorder, sub, headers), result in zip(items, results, strict=True):
                if isinstance(result, Exception):
                    failed.append((sub.task_id, result))
                    continue
                holder = duplicate_of(result.why)
                if holder is not None:
                    holders[id(headers)] = holder
                elif sub.fair is not None and result.applied \
                        and not isinstance(sent, Exception):
                    fair[id(headers)] = (recorder, sub.task_id, sent)
                if holder is not None or (
                        sub.fair is not None and result.state is TaskState.SCHEDULED):
                    dup.add(id(headers))  # parked: published once its key has room
                    continue
                stamp_published(headers, result.now_ms, result.epoch)
                if result.applied and result.previous == "missing":
                    made[id(headers)] = (recorder, sub.task_id)
            if failed:
                # their messages go out as a single publish's would: unrecorded, the worker
                # records each submission at its start
                # (no traceback: its frames would keep the publisher's stack alive)
                first = failed[0][1]
                log.error("could not record the publish of %d of %d member(s) of a bulk "
                          "publish (%s ...: %s: %s): their messages go out, and the worker "
                          "records each at its start", len(failed), len(items),
                          ", ".join(task_id for task_id, _ in failed[:3]),
                          type(first).__name__, first)
        every = self.messages
        if dup:
            if refused is not None and holders:
                for message in self.messages:
                    holder = holders.get(id(message[1].get("headers")))
                    if holder is not None:
                        refused(message, holder)
            self.messages = [m for m in self.messages if id(m[1].get("headers")) not in dup]
        try:
            send(self.messages)
        except SendStopped as stop:
            for _, later in self.messages[stop.index:]:
                record = made.get(id(later.get("headers")))
                if record is not None:
                    record[0].never_sent(record[1], stop.error)
            _unsent_fair(every, self.messages, stop, dup, fair)
            raise stop.error from None


def _unsent_fair(every: list[Message], sendable: list[Message], stop: SendStopped,
                 dup: set[int], fair: dict[int, tuple[Recording, str, SentSteps]]) -> None:
    """After a message of the cut failed: the fair-share members that will never be sent
    give their keys' places back at once (else each held one for ``ON_THE_WAY_MS``), and
    the members parked after the failed message are cancelled, not released later: in
    Celery, whose loop stops at the raise, they would never have been published, and the
    caller, told the publish failed, may publish the group again. Never raises."""
    if not fair:
        return
    failed = id(sendable[stop.index][1].get("headers")) if stop.index < len(sendable) else None
    after = False
    gone: dict[int, list[str]] = {}  # id(sent steps) -> ids
    steps: dict[int, SentSteps] = {}
    for _, message in every:
        key = id(message.get("headers"))
        after = after or key == failed
        held = fair.get(key)
        if held is None or not after:
            continue
        recorder, task_id, sent = held
        if key in dup:
            recorder.never_released(task_id, stop.error)  # parked: cancelled
        gone.setdefault(id(sent), []).append(task_id)
        steps[id(sent)] = sent
    for ref, ids in gone.items():
        try:
            steps[ref].never_sent(ids)
        except Exception:  # a place not given back expires
            log.warning("could not give back the fair-share places of %d member(s) never "
                        "sent", len(ids), exc_info=True)


class PublishBatch:
    """One bulk publish's held steps and messages (see the module's docstring).

    ``send(messages)`` publishes the messages of one cut in order (a :data:`Sender`);
    ``size``: members whose steps go in one store call (fewer once their payloads reach
    :data:`CUT_BYTES`); ``refused``: told of each member a unique task's copy kept from
    being sent (a :data:`Refused`). Not thread-safe: one publishing
    thread (it lives in that thread's context).
    """

    def __init__(self, send: Sender, size: int, refused: Refused | None = None) -> None:
        self._send = send
        self._refused = refused
        self.size = max(1, size)
        self._held: list[_Held] = []
        self._held_bytes = 0  # of the held steps' payloads
        self._messages: list[Message] = []
        self._flight: _Segment | None = None  # written, replies not read yet
        self._stopped = False

    def add(self, recorder: Recording, submission: Submission,
            headers: dict[str, Any]) -> None:
        """Hold a member's step (the recorder's, for the message whose ``headers`` these
        are): written at the next cut, its headers stamped before its message goes."""
        self._held.append((recorder, submission, headers))
        self._held_bytes += len(submission.fields.get("msg") or "")

    def hold(self, body: Any, kwargs: dict[str, Any]) -> None:
        """Hold a message (every publish through the batch's producer, recorded or not: the
        broker gets them in the order published); cut once ``size`` steps (or
        :data:`CUT_BYTES` of their payloads), or ``size`` messages (a group of plain tasks
        records none), are held."""
        if self._stopped:
            raise RuntimeError("this bulk publish already stopped at an error")
        self._messages.append((body, kwargs))
        if (len(self._held) >= self.size or len(self._messages) >= self.size
                or self._held_bytes >= CUT_BYTES):
            self._cut()

    def _cut(self) -> None:
        """Finish the batch in flight (its messages out), then write the steps held."""
        segment = _Segment(self._held, self._messages)
        self._held, self._messages, self._held_bytes = [], [], 0
        flight, self._flight = self._flight, None
        if flight is not None:
            try:
                flight.finish(self._send, self._refused)
            except BaseException:
                self._stopped = True  # nothing after the failed message is published
                raise
        if segment.held or segment.messages:
            segment.write()
            self._flight = segment

    def close(self) -> None:
        """The end of the publish: write what is held, then publish every message held."""
        if self._stopped:
            return
        self._cut()
        flight, self._flight = self._flight, None
        if flight is not None:
            try:
                flight.finish(self._send, self._refused)
            finally:
                self._stopped = True

    def abandon(self) -> None:
        """The publish raised before its end (a member Celery could not build): the members
        before it go out as in Celery, whose loop published them before the raise; an error
        here is logged, never raised over the publish's own."""
        try:
            self.close()
        except Exception:
            log.exception("a bulk publish raised, and publishing its members held before "
                          "the error failed too")


#: The batch of the publish in progress in this context (:func:`enter`), read by the publish
#: signal's handler: ``None`` for a publish that goes straight to the broker.
_current: ContextVar[PublishBatch | None] = ContextVar("jobbers_publish_batch", default=None)


def current() -> PublishBatch | None:
    return _current.get()


def enter(producer: Any) -> Token[PublishBatch | None]:
    """Around one publish (``app.send_task``, which ``install`` wraps): the batch that holds
    its message if ``producer`` is a batch's (it has ``jobbers_batch``), else none: only a
    message the batch holds may have its step held (any other goes out at once)."""
    return _current.set(getattr(producer, "jobbers_batch", None))


def leave(token: Token[PublishBatch | None]) -> None:
    _current.reset(token)


#: The fair-shares key of the member being published through a batch (:func:`fair_member`),
#: read by the recorder as it holds the member's step.
_fair: ContextVar[FairKey | None] = ContextVar("jobbers_member_fair", default=None)


@contextmanager
def fair_member(key: FairKey | None) -> Iterator[None]:
    """Around the publish of a batch's member whose task has a ``concurrency_key``
    (``key``: its call's): its step is held with it, so that the step parks it when its key
    has no room (no message is sent; published once released, as a single publish parked).
    """
    token = _fair.set(key)
    try:
        yield
    finally:
        _fair.reset(token)


def member_fair() -> FairKey | None:
    return _fair.get()
