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

A unique task's member whose key another copy holds is not sent (see
:mod:`jobbers_celery.lifecycle.bulk`): :func:`revoke_duplicate` stores its result REVOKED at
once, as Celery stores a member revoked before it ran, so that the ``GroupResult`` does not
wait for it for ever (``get()`` raises ``TaskRevokedError``, or returns it with
``propagate=False``), a chord's header member counts its part (the chord's callback fails
with ``ChordError``) and every task of the chain it starts is REVOKED too (a group link's
members, a chord link's callback and header). It gets no jobbers record (its step was
refused). A single publish refused so (a chain's link, a callback a worker publishes) goes
through :func:`revoke_in_canvas`, called where the refusal is caught.

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
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

from celery import canvas
from celery.app.task import Context
from kombu.exceptions import BatchPublishError  # type: ignore[attr-defined]  # kombu 5.7; stubs older
from kombu.utils import json as kombu_json

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.unique import DuplicateTask
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import bodyjson, bulk

__all__ = ["BufferingProducer", "install", "revoke_duplicate", "revoke_in_canvas"]

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
            batch = bulk.PublishBatch(functools.partial(_send, real), size,
                                      functools.partial(_refused, app))
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


def revoke_duplicate(app: Any, task_id: str, name: str, holder: str, *, chord: Any = None,
                     group_id: str | None = None, group_index: int | None = None,
                     chain: Any = None) -> None:
    """Store REVOKED for the publish of ``name`` as ``task_id`` that was not sent because
    ``holder`` holds its unique key, when it belongs to a canvas, as Celery's worker stores
    a task revoked before it ran (``Backend.mark_as_revoked`` with its request): the reason
    names the holder, and a chord's header member counts its part (``chord``, ``group_id``,
    ``group_index``: its callback fails with ``ChordError`` once every part returned).

    The rest of the ``chain`` it starts is never sent either: every task in it that has an
    id is REVOKED too (see :func:`_rest`), a task in a chord's header counting its part.
    Celery's worker does not do this for a revoked link (the rest of its chain stays
    PENDING); it is how ``Backend._fail_chain`` ends a failed link's chain, and further. A
    backend error is logged, never raised: nothing was sent either way."""
    reason = str(DuplicateTask(name, holder))
    request = Context(id=task_id, task=name, group=group_id, group_index=group_index,
                      chord=chord, delivery_info={})
    try:
        _backend(app, name).mark_as_revoked(task_id, reason, request=request)
        for later in _rest(chain, task_id):
            _backend(app, getattr(later, "task", None)).mark_as_revoked(later.id, reason,
                                                                         request=later)
    except Exception:
        log.warning("%s[%s] was not sent (a copy holds its unique key: %s), and its result "
                    "could not be stored REVOKED: whatever waits for it waits on",
                    name, task_id, holder, exc_info=True)


def revoke_in_canvas(app: Any, task_id: Any, name: Any, holder: str,
                     options: Mapping[str, Any]) -> None:
    """A single publish (not a group's batch) of ``name`` as ``task_id`` not sent because
    ``holder`` holds its unique key: :func:`revoke_duplicate` when ``options`` (its
    ``send_task``/``apply_async`` options) put it in a canvas (a chain's link, its last
    included, a chord's header member, a group's member published through a producer of
    its own or delayed) or a worker publishes it as a callback (a chord's callback, a
    ``link``, a chain's next link: Celery's ``_retry_publish``), whose id was made before
    and may be waited on; a lone publish stores nothing (its caller gets the holder's
    result)."""
    chain, chord, group_id = options.get("chain"), options.get("chord"), \
        options.get("group_id")
    if not isinstance(task_id, str) or not isinstance(name, str) or not (
            chain is not None or chord or group_id or _celery_retries_each()):
        return
    index = options.get("group_index")
    revoke_duplicate(app, task_id, name, holder, chord=chord,
                     group_id=group_id if isinstance(group_id, str) else None,
                     group_index=index if isinstance(index, int) else None, chain=chain)


def _backend(app: Any, name: Any) -> Any:
    task = app.tasks.get(name) if isinstance(name, str) else None
    return task.backend if task is not None else app.backend


#: The canvases a chain's rest holds: where their tasks are in the signature's kwargs.
_NESTED = {"group": ("tasks",), "chain": ("tasks",), "chord": ("header", "body")}

#: At most this many signatures of one chain's rest are read (a bound on what a message
#: may hold, not met by a real canvas: a chain ending in a group of 10,000 members is
#: 10,001).
_REST_MAX = 1_000_000


def _rest(chain: Any, first: str) -> Iterator[Context]:
    """The requests of every task of a chain's rest (``chain``: the link's ``chain`` option,
    signatures or their dicts in a message, last link first) that has an id, each once, as
    Celery's ``Backend._fail_chain`` walks it for a failed link: each link (a group's or a
    chord's own id too), a chord link's body; and further, as none of them is ever sent: a
    group link's members and a chord link's header members, so that a ``GroupResult`` the
    chain ends with, or a chord's header, does not wait for ever either. A task in a chord's
    header (its request's ``chord``) counts its part."""
    pending: deque[Any] = deque(_signatures(chain))
    seen = {first}
    read = 0
    while pending and read < _REST_MAX:
        sig, read = pending.popleft(), read + 1
        if not isinstance(sig, dict):
            continue
        request = _link_request(sig)
        if request is not None and isinstance(request.id, str) and request.id not in seen:
            seen.add(request.id)
            yield request
        kwargs = sig.get("kwargs")
        for field in _NESTED.get(str(sig.get("subtask_type")), ()):
            part = kwargs.get(field) if isinstance(kwargs, dict) else None
            pending.extend([part] if isinstance(part, dict) else _signatures(part))


def _signatures(value: Any) -> list[Any]:
    """A list of signatures (a list, a tuple, Celery's ``regen`` of a group's tasks)."""
    if value is None or isinstance(value, str | bytes | dict):
        return []
    try:
        return list(value)
    except TypeError:
        return []


def _link_request(link: dict[str, Any]) -> Context | None:
    """A signature's request (a signature, or its dict in a message), as Celery's
    ``_fail_chain`` builds it: ``None`` for one that has no id."""
    options = link.get("options")
    options = options if isinstance(options, dict) else {}
    task_id = options.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        return None
    request = Context(link)
    request.update(options)
    request.id, request.group = task_id, options.get("group_id")
    request.delivery_info = {}
    return request


def _refused(app: Any, message: bulk.Message, holder: str) -> None:
    """A member the batch did not send (see :func:`revoke_duplicate`), read from its
    message: protocol 2 headers (``id``, ``task``, ``group``, ``group_index``) and the
    body's embed (``chord``, ``chain``); the body is the text :mod:`bodyjson` encoded, or
    the arguments kombu encodes later."""
    body, kwargs = message
    headers = kwargs.get("headers") or {}
    task_id, name = headers.get("id"), headers.get("task")
    if not isinstance(task_id, str) or not isinstance(name, str):
        return  # protocol 1: its body holds these, not read
    if isinstance(body, str | bytes) and kwargs.get("content_type") == bodyjson.CONTENT_TYPE:
        try:
            body = kombu_json.loads(body)
        except ValueError:
            body = None
    embed = body[2] if isinstance(body, list | tuple) and len(body) == 3 else None
    embed = embed if isinstance(embed, dict) else {}
    index = headers.get("group_index")
    revoke_duplicate(app, task_id, name, holder, chord=embed.get("chord"),
                     group_id=headers.get("group"),
                     group_index=index if isinstance(index, int) else None,
                     chain=embed.get("chain"))
