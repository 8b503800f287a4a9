"""The digest that names a key made of user data (a unique task's lock, a rate limit's
window, a fair share's list) in the store: SHA-256 of the value's canonical JSON, bounded
before it is hashed. The value never reaches a Redis key, a history reason or a page; the
digest is 64 hex digits, the same in every process, so a key name made of it needs no
separator a value could forge. Pure.

The canonical JSON: sorted keys, no spaces, no NaN or infinity, UTF-8. It takes the values
Celery's JSON serializer carries, written as their canonical text (so the publisher, which
has the caller's objects, and the worker, which has the decoded ones, make the same key):
``datetime``/``date``/``time`` in ISO 8601, ``UUID`` and ``Decimal`` as their text,
``bytes`` as hex, a set as a list sorted by its members' canonical JSON.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import uuid
from typing import Any

__all__ = ["MAX_KEY_BYTES", "canonical_digest", "canonical_json"]

#: Bytes of canonical JSON a rate-limit or fair-share key value may be; a bigger one is
#: refused, never hashed.
MAX_KEY_BYTES = 1024


def _plain(value: Any) -> Any:
    """JSON for the values JSON has no type for but whose text is canonical."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset):
        return sorted(value, key=canonical_json)
    raise TypeError(f"{type(value).__name__} is not JSON")


def canonical_json(value: Any) -> str:
    """``value``'s canonical JSON; raises ``TypeError`` (a value it cannot write) or
    ``ValueError`` (NaN, infinity, a circular reference)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False, default=_plain)


def canonical_digest(value: Any, what: str, error: type[ValueError],
                     max_bytes: int = MAX_KEY_BYTES) -> str:
    """``value``'s digest (hex SHA-256 of its canonical JSON); raises ``error`` naming
    ``what`` (``"the rate-limit key"``) when it is not JSON or over ``max_bytes``."""
    try:
        text = canonical_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise error(f"{what} is not JSON: {exc}") from None
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise error(f"{what}'s value is over {max_bytes} bytes of JSON: key by something "
                    "shorter (an id)")
    return hashlib.sha256(data).hexdigest()
