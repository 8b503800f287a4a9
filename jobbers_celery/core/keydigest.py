"""The digest that names a key made of user data (a rate limit's, a fair share's) in the
store: SHA-256 of the value's canonical JSON (sorted keys, no spaces), bounded before it is
hashed. The value never reaches a Redis key, a history reason or a page; the digest is 64
hex digits, the same in every process, so a key name made of it needs no separator a value
could forge. Pure."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["MAX_KEY_BYTES", "canonical_digest"]

#: Bytes of canonical JSON a key value may be; a bigger one is refused, never hashed.
MAX_KEY_BYTES = 1024


def canonical_digest(value: Any, what: str, error: type[ValueError]) -> str:
    """``value``'s digest; raises ``error`` naming ``what`` (``"the rate-limit key"``) when
    it is not JSON or over :data:`MAX_KEY_BYTES`."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise error(f"{what} is not JSON: {exc}") from None
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > MAX_KEY_BYTES:
        raise error(f"{what}'s value is over {MAX_KEY_BYTES} bytes of JSON: key by something "
                    "shorter (an id)")
    return hashlib.sha256(data).hexdigest()
