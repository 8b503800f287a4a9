"""The worker's side of pauses (see :mod:`jobbers_celery.lifecycle.pausing`).

The worker's main process keeps the pauses it last read (:data:`PAUSED`), read again:

- at start (:class:`PauseStep`, before the consumer starts): a paused queue is taken out of
  the queues the worker consumes (``app.amqp.queues.deselect``, as ``-X`` does), so a
  worker started later never fetches from it;
- when the control command ``jobbers_pauses`` comes (a pause or resume broadcasts it);
- every ``jobbers_pause_poll_interval`` (a thread), for a worker the broadcast missed.

Queues are applied in the consumer's own loop, as Celery's ``cancel_consumer`` and
``add_consumer`` do (``cancel_task_queue``/``add_task_queue``); a queue is added back only
on a worker that consumed it before the pause. A message of a paused task name reaching
the worker is held before it takes a pool slot (:func:`hold_if_paused`, from the request):
its record goes ``scheduled`` with the reason ``paused: ...`` and no ``run_at`` (the store
checks the pause in the same script), and the message is acknowledged, its payload kept in
the record. A message the worker had fetched from a queue it no longer consumes goes back
to the broker (rejected with requeue), to wait there with the rest of the queue.

The queue a message came from is not its routing key (a binding of another key, another
exchange, a fanout): on AMQP it is the queue of the consumer tag it was delivered to (the
tags of queues cancelled for a pause are kept, since their fetched messages arrive after
the cancel), and a reject with requeue returns it to that queue. Kombu's virtual transports
(Redis, SQS...) tell no tag, and their reject with requeue restores a message through its
exchange and routing key into every queue they route (a copy into each): there
:class:`SourceStep` stamps the queue each message was delivered from (kombu calls one
callback per queue) into its ``delivery_info``, and the message is given back by putting
it into that one queue and acknowledging the one fetched. A message whose queue is not
known is not given back: it runs (logged once).
"""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.worker.control import control_command
from celery.worker.state import task_ready

from jobbers_celery.core.pauses import PauseKind, held_reason
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle.pausing import CONTROL_COMMAND

if TYPE_CHECKING:
    from jobbers_celery.store import PauseStore

__all__ = ["PAUSED", "SOURCE", "PauseStep", "Paused", "SourceStep", "hold_if_paused",
           "jobbers_pauses"]

log = escaped_logger("jobbers.pause")

#: The ``delivery_info`` key :class:`SourceStep` stamps: the queue a message came from.
SOURCE = "jobbers_queue"


class Paused:
    """The pauses this worker process obeys (one per process: a worker runs one app)."""

    def __init__(self) -> None:
        self.names: frozenset[str] = frozenset()
        self.queues: frozenset[str] = frozenset()
        #: queues this worker consumed and stopped consuming for a pause (consumer thread)
        self.here: set[str] = set()
        #: of those: consumer tag -> queue (AMQP)
        self.tags: dict[str, str] = {}

    def refresh(self, store: PauseStore) -> None:
        got = store.pauses()
        self.names = frozenset(p.target for p in got if p.kind is PauseKind.TASK)
        self.queues = frozenset(p.target for p in got if p.kind is PauseKind.QUEUE)

    def queues_differ(self) -> bool:
        """Whether the consumer has queues to cancel or to add back."""
        return bool(self.here - self.queues) or bool(self.queues & _consumed(None))

    def deselect(self, app: Any) -> None:
        """Before the consumer starts: leave the paused queues out of those it consumes."""
        queues = app.amqp.queues
        for name in sorted(self.queues & set(queues.consume_from)):
            queues.deselect(name)
            self.here.add(name)
            log.info("not consuming from queue %s: it is paused", name)

    def apply(self, consumer: Any) -> None:
        """In the consumer's loop: cancel the paused queues it consumes, add back those it
        stopped for a pause that is over."""
        tc = consumer.task_consumer
        if tc is None:
            return
        for name in sorted(self.queues & _consumed(consumer)):
            tag = _active_tags(tc).get(name)
            if tag is not None:
                self.tags[str(tag)] = name
            consumer.cancel_task_queue(name)
            self.here.add(name)
        for name in sorted(self.here - self.queues):
            consumer.add_task_queue(name)
            self.here.discard(name)
            self.tags = {t: q for t, q in self.tags.items() if q != name}

    def source(self, delivery_info: dict[str, Any]) -> str | None:
        """The queue a message with ``delivery_info`` came from: its consumer tag's (AMQP)
        or the one :class:`SourceStep` stamped (virtual transports); ``None``: unknown."""
        tag = delivery_info.get("consumer_tag")
        if tag is not None:
            tc = getattr(_consumer, "task_consumer", None)
            found = self.tags.get(str(tag)) or next(
                (q for q, t in _active_tags(tc).items() if str(t) == str(tag)), None)
            if found:
                return str(found)
        stamped = delivery_info.get(SOURCE)
        return stamped if isinstance(stamped, str) and stamped else None


#: The pauses of this process (the worker's main process).
PAUSED = Paused()
_consumer: Any = None  # the worker's consumer, once PauseStep started


def _active_tags(tc: Any) -> dict[str, Any]:
    """kombu's queue name -> consumer tag of ``tc`` (a ``kombu.Consumer``)."""
    tags = getattr(tc, "_active_tags", None)
    return dict(tags) if isinstance(tags, dict) else {}


def _consumed(consumer: Any) -> set[str]:
    consumer = consumer if consumer is not None else _consumer
    tc = getattr(consumer, "task_consumer", None)
    return {q.name for q in list(getattr(tc, "queues", ()))} if tc is not None else set()


@control_command(name=CONTROL_COMMAND)
def jobbers_pauses(state: Any, **_: Any) -> dict[str, Any]:
    """Read jobbers' pauses again and apply them now."""
    consumer = state.consumer
    jobbers = Jobbers.find(consumer.app)
    if jobbers is None:
        return {"error": "jobbers is not installed in this worker"}
    PAUSED.refresh(jobbers.store)
    consumer.call_soon(PAUSED.apply, consumer)
    return {"ok": {"tasks": sorted(PAUSED.names), "queues": sorted(PAUSED.queues)}}


def hold_if_paused(request: Any) -> bool:
    """Called by the request in the worker's main process before the pool: ``True`` when
    the message was held (its task name is paused) or given back (its queue is paused
    here), and must not run."""
    name = request.name
    if name in PAUSED.names and getattr(request.task, "jobbers_options", None) is not None:
        try:
            res = Jobbers.of(request.task.app).store.hold(
                request.id, name, worker=request.hostname, reason=held_reason(name))
        except Exception:
            log.exception("could not hold %s[%s] (its task name is paused); it runs",
                          name, request.id)
            return False
        if res.applied and res.state is TaskState.SCHEDULED:
            log.info("holding %s[%s]: its task name is paused", name, request.id)
            request._already_revoked = True
            task_ready(request)
            request.acknowledge()
            return True
        if res.why == "not_paused":
            PAUSED.names = PAUSED.names - {name}
        return False  # no longer paused, or not submitted: the start decides
    if not PAUSED.here:
        return False
    message = getattr(request, "message", None)
    info = getattr(message, "delivery_info", None) or request.delivery_info or {}
    came = PAUSED.source(info)
    if came is None:
        global _unknown_logged
        if not _unknown_logged:
            _unknown_logged = True
            log.warning("cannot tell which queue %s[%s] came from (no consumer tag, no "
                        "stamped queue): it runs, and so do such messages of paused queues",
                        name, request.id)
        return False
    if came not in PAUSED.here:
        return False
    if info.get("consumer_tag") is None and not _put_back(message, came):
        return False
    log.info("giving %s[%s] back to queue %s: the queue is paused", name, request.id, came)
    request._already_revoked = True
    task_ready(request)
    if info.get("consumer_tag") is None:
        request.acknowledge()  # a copy is in its queue already
    else:
        request.reject(requeue=True)  # AMQP: back to the queue it was delivered from
    return True


_unknown_logged = False


def _put_back(message: Any, queue: str) -> bool:
    """Put a copy of ``message`` (a virtual transport's) into ``queue`` only, under a new
    delivery tag; whether it was."""
    raw = getattr(message, "_raw", None)
    put = getattr(getattr(message, "channel", None), "_put", None)
    if not isinstance(raw, dict) or put is None:
        return False
    props = dict(raw.get("properties") or {})
    props["delivery_tag"] = str(uuid.uuid4())
    props["delivery_info"] = {k: v for k, v in (props.get("delivery_info") or {}).items()
                              if k != SOURCE}
    try:
        put(queue, {**raw, "properties": props})
    except Exception:
        log.exception("could not give a message back to queue %s; it runs", queue)
        return False
    return True


class _Stamping(dict[str, Any]):
    """A virtual transport's queue -> delivery callback map whose callbacks stamp the queue
    into each raw message's ``delivery_info`` before kombu makes it a message."""

    def __setitem__(self, queue: str, callback: Any) -> None:
        def stamped(raw: Any) -> Any:
            props = raw.get("properties") if isinstance(raw, dict) else None
            if isinstance(props, dict):
                info = props.get("delivery_info")
                if isinstance(info, dict):
                    info[SOURCE] = queue
            return callback(raw)

        super().__setitem__(queue, stamped)


class SourceStep(bootsteps.StartStopStep):
    """A consumer step: on a virtual transport, stamp each message's source queue (see the
    module). Runs again on each new connection (the consumer's steps restart)."""

    label = "jobbers message source"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        transport = getattr(getattr(c, "connection", None), "transport", None)
        callbacks = getattr(transport, "_callbacks", None)
        if transport is not None and type(callbacks) is dict:
            stamping = _Stamping()
            for queue, callback in callbacks.items():
                stamping[queue] = callback
            transport._callbacks = stamping


class PauseStep(bootsteps.StartStopStep):
    """Reads the pauses at the worker's start, and keeps reading them (see the module)."""

    label = "jobbers pauses"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        global _consumer
        jobbers = Jobbers.of(parent.app)
        try:
            PAUSED.refresh(jobbers.store)
        except Exception as exc:  # noqa: BLE001 - the poll reads them once it answers
            log.warning("could not read the pauses at start: %s", exc)
        PAUSED.deselect(parent.app)
        _consumer = getattr(parent, "consumer", None)
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, args=(jobbers,),
                                        name="jobbers-pauses", daemon=True)
        self._thread.start()

    def _poll(self, jobbers: Jobbers) -> None:
        every = jobbers.config.pause_poll_interval
        failing = False
        while not self._stop.wait(every):
            try:
                PAUSED.refresh(jobbers.store)
            except Exception as exc:  # noqa: BLE001 - logged once, tried again
                if not failing:
                    log.warning("could not read the pauses: %s", exc)
                failing = True
                continue
            failing = False
            if _consumer is not None and PAUSED.queues_differ():
                _consumer.call_soon(PAUSED.apply, _consumer)

    def stop(self, parent: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)

    shutdown = stop
    terminate = stop

