"""One JSON encoding of a published message's arguments, shared by the broker's body and the
record's payload.

Why: the record keeps a task's payload (its ``args``, ``kwargs`` and publish options, see
:mod:`jobbers_celery.lifecycle.payload`) so that jobbers can publish it again, and kombu
encodes the message body (``[args, kwargs, embed]``) once more after the publish signal:
a ``starmap`` of 10,000 pairs spent 2.6 ms of a 13 ms publish encoding them twice. So a
publish that goes through a producer of jobbers (:class:`SharingProducer`, which
``install`` hands every ``send_task`` of the app, and a group's buffering producer) defers
its ``submitted`` step: the publish signal's handler builds the step and leaves it here
(:func:`defer`), and when the message reaches the producer (after every
``before_task_publish`` receiver, so one that changes the body in place is seen by both),
:func:`publish` encodes the arguments once, writes the step with a payload made of that
text, then hands kombu the body's text as kombu's json serializer would have written it
(``"[" args ", " kwargs ", " embed "]"``, the encoder's own separators), content type
set, so that kombu does not encode it again. The step is still written before the message
goes (or, in a group, held with it until written).

Shared only with kombu's own json serializer (``serializer="json"`` as registered by kombu,
no ``content_type`` given); any other serializer, or arguments the encoder refuses, and
kombu encodes the body itself (raising its own ``EncodeError``) while the record gets its
payload as before (:func:`record_text`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any

from kombu.serialization import registry  # type: ignore[attr-defined]  # not in its stubs
from kombu.utils import json as kombu_json

from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.deadletter.payloadjson import dumps, seal_arguments

__all__ = ["CONTENT_ENCODING", "CONTENT_TYPE", "Pending", "SharedBody", "SharingProducer",
           "close", "defer", "encode", "open_slot", "payload_text", "publish", "record_text",
           "shares"]

log = escaped_logger("jobbers.lifecycle")

CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"


class SharedBody:
    """A protocol-2 body encoded once: ``text`` is the whole body as kombu writes it,
    ``args`` and ``kwargs`` the JSON of its first two items (slices of the same work)."""

    __slots__ = ("args", "kwargs", "text")

    def __init__(self, args: str, kwargs: str, embed: str) -> None:
        self.args = args
        self.kwargs = kwargs
        self.text = f"[{args}, {kwargs}, {embed}]"


def encode(body: Any) -> SharedBody | None:
    """``body`` encoded by kombu's JSON encoder, or ``None`` if it is not a protocol-2 body
    of a plain tuple or list of arguments and a dict of keyword arguments (then kombu
    encodes it). Raises what the encoder raises (``TypeError``: not JSON)."""
    if not (type(body) is tuple or type(body) is list) or len(body) != 3:
        return None
    args, kwargs, embed = body
    if not (type(args) is tuple or type(args) is list) or type(kwargs) is not dict:
        return None
    return SharedBody(dumps(args), dumps(kwargs), dumps(embed))


def payload_text(shared: SharedBody, options: dict[str, Any],
                 codec: PayloadCodec | None) -> str:
    """The record's payload of ``shared`` (what :func:`record_text` makes of the same
    arguments and ``options``, from the text already encoded); its arguments sealed when
    ``codec`` holds payload keys. Raises ``TypeError`` if ``options`` are not JSON."""
    if codec is None or not codec.enabled:
        return f'{{"args": {shared.args}, "kwargs": {shared.kwargs}, "options": {dumps(options)}}}'
    sealed = codec.seal(f'{{"args": {shared.args}, "kwargs": {shared.kwargs}}}')
    return dumps({"args": [], "kwargs": sealed, "options": options})


def record_text(payload: dict[str, Any], codec: PayloadCodec | None) -> str:
    """``payload`` as the record keeps it, encoded on its own (a publish whose body is not
    shared): JSON, its arguments sealed when payload keys are set; arguments that are not
    JSON are kept as a person can read them (such a task cannot be republished)."""
    try:
        if codec is None or not codec.enabled:  # (every publish: no copy of it to dump)
            return dumps(payload)
        return dumps(seal_arguments(payload, codec))
    except TypeError:
        return dumps(seal_arguments(
            {"unserializable": True, "args": repr(payload.get("args")),
             "kwargs": repr(payload.get("kwargs")), "options": {}}, codec))


def shares(kwargs: dict[str, Any]) -> bool:
    """Whether kombu would encode a body published with ``kwargs`` (a producer's
    ``publish`` keyword arguments) with its own json serializer: the one the shared text
    stands for."""
    if kwargs.get("serializer") != "json" or kwargs.get("content_type"):
        return False
    codec = registry._encoders.get("json")  # kombu's registry has no getter
    return codec is not None and codec.encoder is kombu_json.dumps


class Pending:
    """A publish's ``submitted`` step, built in the publish signal, waiting for its payload:
    ``finish(msg)`` writes it (or holds it in its group's batch) and stamps the headers."""

    __slots__ = ("body", "codec", "finish", "name", "options", "task_id")

    def __init__(self, task_id: str, name: str, body: Any, options: dict[str, Any],
                 codec: PayloadCodec | None, finish: Callable[[str], None]) -> None:
        self.task_id = task_id
        self.name = name
        self.body = body
        self.options = options
        self.codec = codec
        self.finish = finish

    def record_alone(self) -> str:
        """The payload encoded on its own, from the body as it is now."""
        args, kwargs = self.body[0], self.body[1]
        return record_text({"args": list(args or ()), "kwargs": dict(kwargs or {}),
                            "options": self.options}, self.codec)


class _Slot:
    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[Pending] = []


#: The publish in progress whose producer takes its step over (:func:`open_slot`).
_slot: ContextVar[_Slot | None] = ContextVar("jobbers_shared_body", default=None)


def open_slot() -> Token[_Slot | None]:
    """Around one ``send_task`` whose producer is jobbers' (its ``publish`` goes through
    :func:`publish`): the publish signal may defer its step to it."""
    return _slot.set(_Slot())


def close(token: Token[_Slot | None], *, sent: bool) -> None:
    """The end of that ``send_task``. A step still deferred (its message never reached
    jobbers' producer: none is known to do so) is written now if ``sent``, late rather than
    never; dropped if the publish raised (no message left)."""
    slot = _slot.get()
    _slot.reset(token)
    if slot is None or not slot.pending or not sent:
        return
    for pending in slot.pending:
        log.warning("the publish of %s[%s] did not reach jobbers' producer; its submission "
                    "is recorded after the message was sent", pending.name, pending.task_id)
        _finish(pending, None)


def defer(pending: Pending) -> bool:
    """Leave ``pending`` to the producer (see the module's docstring): ``False`` when no
    producer of jobbers publishes this message (write the step now)."""
    slot = _slot.get()
    if slot is None:
        return False
    slot.pending.append(pending)
    return True


def _take(body: Any) -> Pending | None:
    slot = _slot.get()
    if slot is None or not slot.pending:
        return None
    for i, pending in enumerate(slot.pending):
        if pending.body is body:
            return slot.pending.pop(i)
    return None


def _finish(pending: Pending, msg: str | None) -> None:
    """Write ``pending`` with ``msg`` (its own encoding if ``None``); a failure is logged,
    as the publish signal logs one: the message still goes, and its worker records it."""
    try:
        pending.finish(pending.record_alone() if msg is None else msg)
    except Exception:
        log.exception("could not record the publish of %s[%s]", pending.name, pending.task_id)


def publish(send: Callable[[Any, dict[str, Any]], Any], body: Any,
            kwargs: dict[str, Any]) -> Any:
    """A producer's ``publish(body, **kwargs)`` through ``send``: the step deferred for
    ``body`` (if any) written first, its payload and the body's text encoded once."""
    pending = _take(body)
    if pending is None:
        return send(body, kwargs)
    msg: str | None = None
    if shares(kwargs):
        try:
            shared = encode(body)
            if shared is not None:
                msg = payload_text(shared, pending.options, pending.codec)
        except Exception:  # noqa: BLE001 - not JSON: kombu raises its own error
            shared = None
        if shared is not None and msg is not None:
            body = shared.text
            kwargs = {**kwargs, "content_type": CONTENT_TYPE,
                      "content_encoding": CONTENT_ENCODING}
    _finish(pending, msg)
    return send(body, kwargs)


class SharingProducer:
    """Stands for a kombu ``Producer`` in one ``send_task``: ``publish`` goes through
    :func:`publish`; everything else is the producer's."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer

    def publish(self, body: Any, **kwargs: Any) -> Any:
        return publish(self._send, body, kwargs)

    def _send(self, body: Any, kwargs: dict[str, Any]) -> Any:
        return self._producer.publish(body, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)
