"""What it takes to publish a task again, captured as JSON.

A payload is ``{"args": [...], "kwargs": {...}, "options": {...}}`` where ``options`` are
``send_task`` keyword arguments (routing, headers, callbacks, limits). It is built from a
message being published, or from a running task's request for a delayed retry, and stored
on the record so the scheduler, resubmits and the dead-letter queue can republish the task
with everything it had, without ETA messages and without pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobbers_celery.core.codec import ENCRYPTED, CannotOpen, PayloadCodec
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.storable import storable_value
from jobbers_celery.core.unique import HEADER_UNIQUE
from jobbers_celery.core.workflow import HEADER_WORKFLOW, bounded_id, links, workflow_key
from jobbers_celery.deadletter.errors import describe_exception, describe_traceback
from jobbers_celery.deadletter.payloadjson import dumps, loads, seal_arguments, sealed_arguments

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "HEADER_DEAD_LETTER",
    "HEADER_ENQUEUED_AT",
    "HEADER_EPOCH",
    "HEADER_PUBLISHED_AT",
    "HEADER_TASK",
    "HEADER_VERSION",
    "deferred",
    "describe_exception",
    "describe_traceback",
    "dumps",
    "from_publish",
    "from_signature_options",
    "loads",
    "open_arguments",
    "queue_of",
    "readable_arguments",
    "republish",
    "request_header",
    "seal_arguments",
    "sealed_arguments",
    "unopenable",
    "workflow_of",
]

log = escaped_logger("jobbers.lifecycle")

HEADER_TASK = "jobbers_task"
HEADER_VERSION = "jobbers_version"
HEADER_ENQUEUED_AT = "jobbers_enqueued_at"  # first enqueue, Redis clock ms; kept across retries
HEADER_PUBLISHED_AT = "jobbers_published_at"  # this publish, Redis clock ms
HEADER_EPOCH = "jobbers_epoch"  # the jobbers dataset the submission was recorded in
HEADER_DEAD_LETTER = "jobbers_dlq"  # 1 when the publisher knew the task saves dead letters

#: Celery protocol-2 headers: not user headers, rebuilt by Celery on every publish.
_PROTOCOL_HEADERS = frozenset({
    "lang", "task", "id", "shadow", "eta", "expires", "group", "group_index", "retries",
    "timelimit", "root_id", "parent_id", "argsrepr", "kwargsrepr", "origin", "ignore_result",
    "replaced_task_nesting", "stamped_headers", "stamps",
})

#: ``send_task`` options a payload may carry.
_OPTIONS = frozenset({
    "queue", "exchange", "routing_key", "priority", "headers", "link", "link_error", "chain",
    "chord", "root_id", "parent_id", "group_id", "group_index", "expires", "time_limit",
    "soft_time_limit", "reply_to", "ignore_result", "shadow", "replaced_task_nesting",
})


def _clean(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in _OPTIONS and v not in (None, [], {})}


#: The jobbers headers a recorded payload keeps (the others are made anew by each publish).
_KEPT = frozenset({HEADER_WORKFLOW, HEADER_UNIQUE})


def from_publish(
    headers: Mapping[str, Any],
    body: Any,
    exchange: str | None,
    routing_key: str | None,
    properties: Mapping[str, Any],
) -> dict[str, Any] | None:
    """Payload of a protocol-2 message about to be published (``None`` for other formats)."""
    if not (isinstance(body, tuple | list) and len(body) == 3):
        return None
    args, kwargs, embed = body
    embed = embed or {}
    hard, soft = (headers.get("timelimit") or (None, None))[:2]
    user_headers = {  # and the workflow key (a republish stays in its workflow) and the
        # unique lock (a record made again from its dead letter takes it again)
        k: v for k, v in headers.items()
        if k not in _PROTOCOL_HEADERS and (not k.startswith("jobbers_") or k in _KEPT)
    }
    options: dict[str, Any] = {
        "headers": user_headers,
        "link": embed.get("callbacks"),
        "link_error": embed.get("errbacks"),
        "chain": embed.get("chain"),
        "chord": embed.get("chord"),
        "root_id": headers.get("root_id"),
        "parent_id": headers.get("parent_id"),
        "group_id": headers.get("group"),
        "group_index": headers.get("group_index"),
        "expires": headers.get("expires"),
        "time_limit": hard,
        "soft_time_limit": soft,
        "shadow": headers.get("shadow"),
        "ignore_result": headers.get("ignore_result"),
        "replaced_task_nesting": headers.get("replaced_task_nesting"),
        "priority": properties.get("priority"),
        "reply_to": properties.get("reply_to"),
    }
    if exchange:
        options["exchange"] = exchange
        options["routing_key"] = routing_key
    else:
        options["queue"] = routing_key
    return {"args": list(args or ()), "kwargs": dict(kwargs or {}), "options": _clean(options)}


def from_signature_options(
    args: Any, kwargs: Any, options: Mapping[str, Any]
) -> dict[str, Any]:
    """Payload from a signature's options (``Task.signature_from_request``)."""
    return {"args": list(args or ()), "kwargs": dict(kwargs or {}), "options": _clean(options)}


def deferred(args: Any, kwargs: Any, options: Mapping[str, Any], queue: str,
             now: datetime) -> dict[str, Any]:
    """Payload of a first publish that waits in the store (``countdown``/``eta``) until the
    scheduler publishes it: ``expires`` made absolute ``now``, as Celery does when it
    publishes (it counts from the call, not from the later publish), and ``queue``, the
    one the router chose, named unless the options route it themselves."""
    opts = dict(options)
    expires = opts.get("expires")
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        opts["expires"] = (now + timedelta(seconds=expires)).isoformat()
    elif isinstance(expires, datetime):
        opts["expires"] = expires.isoformat()
    named = opts.get("queue")
    if named is not None and not isinstance(named, str):
        opts["queue"] = queue  # a kombu Queue: its name
    elif not (named or opts.get("exchange") or opts.get("routing_key")):
        opts["queue"] = queue
    return from_signature_options(args, kwargs, opts)


def workflow_of(app: Celery, headers: Mapping[str, Any], body: Any) -> dict[str, str]:
    """The canvas fields of a message being published (see
    :func:`jobbers_celery.core.workflow.links`; empty for a task published alone): a
    message the running task publishes (it is its parent: a chain's next step, a chord's
    callback, a ``replace``) joins that task's workflow; a successor is awaited only if it
    is recorded (not a plain Celery task of ``app``). Never raises: a message whose canvas
    cannot be read is recorded outside any workflow."""
    task_id = headers.get("id")
    if not isinstance(task_id, str):
        return {}
    try:
        inherited = None
        untracked_root = False
        parent_id = headers.get("parent_id")
        if parent_id:  # published by a running task (its parent): which one?
            current = app.current_worker_task
            req = getattr(current, "request", None)
            if req is not None and req.id and req.id == parent_id:
                inherited = bounded_id(request_header(req, HEADER_WORKFLOW))
                if inherited is None and getattr(current, "jobbers_options", None) is None:
                    # a plain task (chord_unlock publishing a chord's callback): not a
                    # member; if it is the root, the message's group names the workflow
                    untracked_root = headers.get("root_id") == parent_id
                elif inherited is None:
                    inherited = workflow_key(req.id, req.root_id, req.group,
                                             getattr(req, "chain", None))
        tasks = app.tasks

        def tracked(name: str) -> bool:  # a JobbersTask, or unknown here (send_task)
            task = tasks.get(name)
            return task is None or getattr(task, "jobbers_options", None) is not None

        return links(task_id, headers, body, tracked=tracked, inherited=inherited,
                     untracked_root=untracked_root)
    except Exception:
        log.exception("could not read the canvas of %s", task_id)
        return {}


def request_header(request: Any, name: str) -> Any:
    """A custom message header as a task request (Celery ``Context``) carries it: as an
    attribute, or in its ``headers`` dict; ``None`` when absent."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def queue_of(options: Mapping[str, Any]) -> str:
    return str(options.get("queue") or options.get("routing_key") or "")


def republish(
    app: Celery, name: str, task_id: str, payload: Mapping[str, Any], retries: int,
    extra_headers: Mapping[str, Any] | None = None, producer: Any = None,
) -> None:
    """Publish ``task_id`` again through Celery (signals, routing and queue declaration).

    ``producer``: one to reuse across many publishes (``app.producer_or_acquire()``).
    """
    options = dict(payload.get("options") or {})
    if producer is not None:
        options["producer"] = producer
    if extra_headers:
        options["headers"] = {**(options.get("headers") or {}), **extra_headers}
    app.send_task(
        name,
        args=payload.get("args") or [],
        kwargs=payload.get("kwargs") or {},
        task_id=task_id,
        retries=retries,
        **options,
    )


# ---------------------------------------------------------------------- secrets at rest
# The payload's JSON (``dumps``, ``loads``) and its sealing (``seal_arguments``,
# ``sealed_arguments``) are :mod:`jobbers_celery.deadletter.payloadjson`'s, offered here with
# the rest; a task's exception as stored (``describe_exception``, ``describe_traceback``) is
# :mod:`jobbers_celery.deadletter.errors`'.

def open_arguments(args: Any, kwargs: Any,
                   codec: PayloadCodec | None) -> tuple[Any, Any]:
    """The real ``args`` and ``kwargs`` (as given when they are not sealed); raises
    :class:`~jobbers_celery.core.codec.CannotOpen` when this process cannot open them."""
    if not sealed_arguments(args, kwargs):
        return args, kwargs
    if codec is None:
        raise CannotOpen(str(kwargs["kid"]), "this process holds no payload key (set "
                                             "jobbers_payload_keys)")
    try:
        data = loads(codec.open(kwargs))
    except ValueError:
        raise CannotOpen(str(kwargs["kid"]), "what it holds is not JSON") from None
    if not isinstance(data, dict):
        raise CannotOpen(str(kwargs["kid"]), "what it holds is not arguments")
    return data.get("args"), data.get("kwargs")


def unopenable(args: Any, kwargs: Any, codec: PayloadCodec | None) -> str | None:
    """Why this process cannot publish ``args``/``kwargs`` (sealed with a key it does not
    hold, or altered); ``None`` when it can (in clear, or opened here)."""
    try:
        open_arguments(args, kwargs, codec)
    except CannotOpen as exc:
        return str(exc)
    return None


def readable_arguments(args: Any, kwargs: Any,
                       codec: PayloadCodec | None) -> tuple[Any, Any]:
    """``args`` and ``kwargs`` for a reader (redact them after): opened where ``codec``
    holds the key, else ``[ENCRYPTED]`` and ``{}``. Never raises. Opened values are shown
    in their storable form (``NaN`` as ``"NaN"``, NUL and lone surrogates escaped): sealed
    raw, they never went through it, and pages and ``--json`` need strict JSON and UTF-8;
    a republish opens the real values (:func:`open_arguments`)."""
    try:
        opened = open_arguments(args, kwargs, codec)
    except CannotOpen:
        return [ENCRYPTED], {}
    if opened[0] is args and opened[1] is kwargs:  # in clear: shown as stored
        return args, kwargs
    return storable_value(opened[0]), storable_value(opened[1])
