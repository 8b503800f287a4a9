"""The publisher: sends a recorded task to the broker again.

The scheduler (delayed retries when due), the cleaner (stalled tasks it resubmits), the
resubmits of ``Jobbers`` and the worker's shutdown and outage paths all republish a task
whose ``submitted`` step the recorder already took. They do it here, one way: the payload
recorded on the task, the headers that name its version and dead-letter policy, inside
:func:`internal_publish` so that the publish signal does not record
the submission twice, inside the trace context the payload carries (see
:mod:`~jobbers_celery.telemetry.tracing`: all attempts of a task are one trace), and the publish lease
confirmed (or left to expire, so that a scheduler publishes it again) by the caller.

How every publish is steered lives here too, in the three ContextVars that Celery's publish
signal reads: :func:`internal_publish` (the submission is recorded already),
:func:`unrecorded_publish` (a message given back while the store is away) and
:func:`mark_publishing` (which app sends it, for the record's store).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.store import SchedulingStore
from jobbers_celery.telemetry import tracing

if TYPE_CHECKING:
    from celery import Celery
    from celery.canvas import Signature

__all__ = ["Publisher", "UnpublishablePayload", "internal_publish", "internal_publish_ms",
           "mark_publishing", "publishing_app", "publishing_unrecorded", "unmark_publishing",
           "unrecorded_publish"]

log = escaped_logger("jobbers.publisher")

#: Set while jobbers itself publishes a task whose "submitted" step it already recorded
#: (scheduler claims, resubmits): holds the Redis time of that step.
_internal: ContextVar[int | None] = ContextVar("jobbers_internal_publish", default=None)


@contextmanager
def internal_publish(now_ms: int) -> Iterator[None]:
    token = _internal.set(now_ms)
    try:
        yield
    finally:
        _internal.reset(token)


def internal_publish_ms() -> int | None:
    """The Redis time of the ``submitted`` step of the task jobbers publishes now
    (:func:`internal_publish`), or ``None``: a publish the store must record."""
    return _internal.get()


#: The app publishing right now, for ``before_task_publish`` (which names only the task): two
#: apps of one process may both register a task name, and the record belongs in the store of
#: the app that sends it.
_publishing: ContextVar[Celery | None] = ContextVar("jobbers_publishing_app", default=None)


def mark_publishing(app: Celery) -> Token[Celery | None]:
    """Publishes from here on are ``app``'s, until :func:`unmark_publishing` with the token."""
    return _publishing.set(app)


def unmark_publishing(token: Token[Celery | None]) -> None:
    _publishing.reset(token)


def publishing_app() -> Celery | None:
    return _publishing.get()


#: Set while a worker gives a message back by publishing it again because the state store
#: is unreachable: the publish neither records nor asks the store anything.
_unrecorded: ContextVar[bool] = ContextVar("jobbers_unrecorded_publish", default=False)


def publishing_unrecorded() -> bool:
    """Whether publishes now are ones the store must not record (:func:`unrecorded_publish`)."""
    return _unrecorded.get()


@contextmanager
def unrecorded_publish() -> Iterator[None]:
    token = _unrecorded.set(True)
    try:
        yield
    finally:
        _unrecorded.reset(token)


class UnpublishablePayload(ValueError):
    """The record holds no payload jobbers can publish (not JSON when it was recorded)."""


class Publisher:
    """Republishes recorded tasks through one Celery app."""

    def __init__(self, app: Celery, store: SchedulingStore,
                 codec: PayloadCodec | None = None) -> None:
        self.app = app
        self.store = store
        self.codec = codec  # opens sealed arguments: the broker gets the real values

    @staticmethod
    def payload_of(msg: str | None) -> dict[str, Any]:
        """The recorded payload ``msg``; raises :class:`UnpublishablePayload` if it cannot
        be published."""
        data: Any = pl.loads(msg) if msg else {}
        if data.get("unserializable"):
            raise UnpublishablePayload("its arguments were not JSON-serializable when it "
                                       "was recorded")
        return dict(data)

    def republish(self, task_id: str, name: str, data: Mapping[str, Any], retries: int,
                  now_ms: int, *, resubmit: bool = False, version: str | None = None,
                  dead_letter: bool = False, producer: Any = None) -> None:
        """Publish ``task_id`` whose ``submitted`` step (at Redis time ``now_ms``) applied.

        ``resubmit``: a new run (its first enqueue is now), whose message says the
        ``version`` the task failed with and that it saves dead letters (``dead_letter``),
        as its record does. Raises :class:`~jobbers_celery.core.codec.CannotOpen` (nothing
        published) when ``data``'s arguments are sealed with a key this process does not
        hold: a process that holds it publishes them (the lease expires), never the sealed
        form as arguments.
        """
        args, kwargs = pl.open_arguments(data.get("args"), data.get("kwargs"), self.codec)
        data = {**data, "args": args, "kwargs": kwargs}
        if resubmit:
            headers = dict(data.get("options", {}).get("headers") or {})
            headers.pop(pl.HEADER_ENQUEUED_AT, None)
            if version:
                headers[pl.HEADER_VERSION] = int(version)
            if dead_letter:
                headers[pl.HEADER_DEAD_LETTER] = 1
            data = {**data, "options": {**data.get("options", {}), "headers": headers}}
        with internal_publish(now_ms), tracing.inside(data.get("options", {}).get("headers")):
            pl.republish(self.app, name, task_id, data, retries, producer=producer)

    def republish_signature(self, sig: Signature[Any], *, leased: str | None) -> None:
        """Publish a running task's message again: ``leased`` (the task id whose
        ``unsubmitted`` step took a publish lease: the publish records the submission and
        the lease is confirmed), or ``None`` (already ``submitted``: the publish records
        nothing new)."""
        with tracing.inside(sig.options.get("headers")):
            if leased is not None:
                sig.apply_async()
                self.store.confirm_published([leased])
            else:
                with internal_publish(self.store.now_ms()):
                    sig.apply_async()

    @staticmethod
    def give_back(sig: Signature[Any]) -> None:
        """Publish a message again without asking the store (it cannot be reached)."""
        with unrecorded_publish(), tracing.inside(sig.options.get("headers")):
            sig.apply_async()

    def confirm(self, ids: Iterable[str]) -> None:
        """Drop the publish leases of the tasks now with the broker."""
        self.store.confirm_published(ids)
