"""A task's payload as jobbers stores it: kombu's JSON (as Celery's json serializer writes
it, datetimes, UUIDs and Decimals kept), its arguments sealed when payload keys are set.

A dead-letter entry is built from what the record stores, so these live on the lowest floor
that reads it; :mod:`jobbers_celery.lifecycle.payload` offers them with the rest of the
payload.

Sealed, a payload's (or a dead letter's) ``args`` is ``[]`` and its ``kwargs`` is one
envelope (see :mod:`jobbers_celery.core.codec`) of ``{"args": [...], "kwargs": {...}}``: both
keep their JSON types, so every store (record, outbox, sinks, spool, DLQ rows) keeps the
sealed form as it is, and ``options`` (routing, headers) stay readable for the publish.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kombu.utils.json import JSONEncoder as _KombuEncoder
from kombu.utils.json import loads as _kombu_loads

from jobbers_celery.core.codec import PayloadCodec, is_sealed

__all__ = ["dumps", "loads", "seal_arguments", "sealed_arguments"]

#: kombu's encoder, made once (``kombu.utils.json.dumps`` makes one per call, on every publish).
_ENCODER = _KombuEncoder()


def dumps(value: Any) -> str:
    """JSON with kombu's extra types (datetime, UUID, Decimal), as the json serializer does."""
    return _ENCODER.encode(value)


def loads(raw: str) -> Any:
    return _kombu_loads(raw)


def sealed_arguments(args: Any, kwargs: Any) -> bool:
    """Whether ``args``/``kwargs`` are the sealed form."""
    return not args and is_sealed(kwargs)


def seal_arguments(payload: Mapping[str, Any], codec: PayloadCodec | None, *,
                   stored: bool = False) -> dict[str, Any]:
    """``payload`` with its ``args`` and ``kwargs`` sealed (as it is without keys). A
    message's arguments are always sealed, even those shaped like a sealed value (a
    publisher's own ``kwargs``); ``stored``: arguments jobbers stored (a record's, a dead
    letter's) already sealed are kept as they are. Raises ``TypeError`` if not JSON."""
    args, kwargs = payload.get("args"), payload.get("kwargs")
    if (codec is None or not codec.enabled
            or (stored and sealed_arguments(args, kwargs))):
        return dict(payload)
    return {**payload, "args": [],
            "kwargs": codec.seal(dumps({"args": args, "kwargs": kwargs}))}
