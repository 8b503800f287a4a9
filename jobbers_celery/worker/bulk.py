"""A group's publish as one bulk publish (:mod:`jobbers_celery.lifecycle.bulk`): the one
place jobbers wraps a Celery canvas method.

Celery has no batch-publish hook: ``group.apply_async`` publishes each member in turn through
one producer (``group._apply_tasks``; ``chunks`` publish as a group of ``celery.starmap``
members, a chord's header is a group). :func:`install` wraps ``group.apply_async`` (the class
method, once per process; a group of an app without jobbers, or with
``jobbers_publish_batch`` at 0 or 1, runs Celery's own unchanged) to hand the members a
:class:`BufferingProducer`: ``publish`` holds the message in the group's
:class:`~jobbers_celery.lifecycle.bulk.PublishBatch`, with the member's step, which the publish
signal's handler left to it (:mod:`jobbers_celery.lifecycle.bodyjson`: the payload and the
body encoded once). ``app.send_task``, which ``install`` wraps, tells the handler which
publishes go through the batch's producer: only those are held; a member that publishes
through a producer of its own, a chain's first task for one, is recorded and published at
once, as without the batch.

Not wrapped: an eager group (nothing is published), a group published inside an outer one
(its members join the outer batch), a publish Celery retries for a worker's callback (its
own per-message retry).

What differs from Celery: ``after_task_publish`` is sent when the message is held, before it
reaches the broker (at the next cut, at most ``jobbers_publish_batch`` members later, or when
``apply_async`` returns); a cut's messages go in one kombu publish batch (``Producer.batch``,
kombu 5.7: one pipelined write on a Redis broker instead of a round trip each; published one
by one on a transport without batches, RabbitMQ's); a broker error raises at the member that
finishes the batch, or from ``apply_async``'s end, instead of at the member whose message
failed; the members published before it are the same.
"""

from __future__ import annotations

import functools
from typing import Any

from celery import canvas
from kombu.exceptions import BatchPublishError  # type: ignore[attr-defined]  # kombu 5.7; stubs older

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import bodyjson, bulk

__all__ = ["BufferingProducer", "install"]

log = escaped_logger("jobbers.lifecycle")

#: Transport operations kombu buffers before it writes (a message is one or two: ``LPUSH``,
#: and ``PEXPIRE`` for a queue with ``x-expires``): more than a cut holds.
_BATCH_OPS = 1 << 20


class BufferingProducer:
    """Stands for the group's kombu ``Producer``: ``publish`` holds the message in the batch
    (``jobbers_batch``); everything else is the producer's."""

    def __init__(self, producer: Any, batch: bulk.PublishBatch) -> None:
        self._producer = producer
        self.jobbers_batch = batch

    def publish(self, body: Any, **kwargs: Any) -> None:
        # the member's step, deferred by the publish signal, joins the batch first, its
        # payload and the body encoded once (see jobbers_celery.lifecycle.bodyjson)
        bodyjson.publish(self.jobbers_batch.hold, body, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def _batch_size(app: Any) -> int:
    jobbers = Jobbers.find(app)
    return 0 if jobbers is None else jobbers.config.publish_batch


def _celery_retries_each() -> bool:
    """Celery publishes a worker's callback retrying each message on its own (a
    ContextVar of ``celery.app.amqp`` in the Celery versions that have it)."""
    from celery.app import amqp

    flag = getattr(amqp, "_callback_publish_retry", None)
    return bool(flag is not None and flag.get())


def install() -> None:
    """Wrap ``celery.canvas.group.apply_async`` (idempotent)."""
    original: Any = canvas.group.apply_async
    if getattr(original, "jobbers_bulk", False):
        return

    @functools.wraps(original)
    def apply_async(self: canvas.group, args: Any = None, kwargs: Any = None,
                    add_to_parent: bool = True, producer: Any = None, **options: Any) -> Any:
        app = self.app
        size = 0 if isinstance(producer, BufferingProducer) else _batch_size(app)
        if size <= 1 or app.conf.task_always_eager or _celery_retries_each():
            return original(self, args, kwargs, add_to_parent, producer, **options)
        with app.producer_or_acquire(producer) as real:
            batch = bulk.PublishBatch(functools.partial(_send, real), size)
            try:
                result = original(self, args, kwargs, add_to_parent,
                                  BufferingProducer(real, batch), **options)
            except BaseException:
                batch.abandon()
                raise
            batch.close()
            return result

    apply_async.jobbers_bulk = True  # type: ignore[attr-defined]
    setattr(canvas.group, "apply_async", apply_async)  # noqa: B010 - typed as Celery's


def _send(producer: Any, messages: list[bulk.Message]) -> None:
    """Publish a cut's messages in order in one kombu publish batch (``Producer.batch``:
    on a Redis broker one pipelined write instead of a round trip each; a transport
    without batches publishes each at once, as Celery does).

    A message kombu cannot publish (its encoding fails) stops the batch there: the messages
    before it are written first. A batch whose write fails leaves their delivery uncertain
    (kombu's ``BatchPublishError``, written without retry): its messages are published
    again one at a time with Celery's publish retry, as Celery publishes again a message
    whose reply a dropped connection lost, so one may reach the broker twice (a jobbers
    task's record starts it once)."""
    if not callable(getattr(producer, "batch", None)):  # a producer of the caller's own
        _send_each(producer, messages)
        return
    done = 0
    try:
        with producer.batch(max_size=_BATCH_OPS) as burst:
            for body, kwargs in messages:
                try:
                    producer.publish(body, **kwargs)
                except BaseException:
                    burst.flush()  # those before it go; then the error
                    raise
                done += 1
    except BatchPublishError as exc:
        log.warning("a batch of %d message(s) of a bulk publish could not be written "
                    "(%s: its delivery is uncertain): publishing them one at a time",
                    len(messages), exc)
        _send_each(producer, messages)
    except BaseException as exc:
        raise bulk.SendStopped(done, exc) from exc


def _send_each(producer: Any, messages: list[bulk.Message]) -> None:
    for i, (body, kwargs) in enumerate(messages):
        try:
            producer.publish(body, **kwargs)
        except BaseException as exc:
            raise bulk.SendStopped(i, exc) from exc
