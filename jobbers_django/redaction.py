"""Arguments that look like secrets are shown redacted wherever people read them.

Only the display is redacted: the stored arguments stay whole, because resubmission needs
the real values. Keys match when they contain one of ``JOBBERS_REDACT_KEYS``
(case-insensitive, ``-`` and ``_`` alike), at any depth of dicts and lists.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobbers_django import conf

REDACTED = "********"


def _needles() -> tuple[str, ...]:
    keys: Iterable[str] = conf.get("REDACT_KEYS")
    return tuple(k.lower().replace("-", "_") for k in keys)


def is_secret_key(key: object, needles: tuple[str, ...] | None = None) -> bool:
    if not isinstance(key, str):
        return False
    name = key.lower().replace("-", "_")
    return any(n in name for n in (needles if needles is not None else _needles()))


def redact(value: Any, needles: tuple[str, ...] | None = None) -> Any:
    """A copy of ``value`` with the values under secret-looking keys replaced."""
    needles = needles if needles is not None else _needles()
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_key(k, needles) else redact(v, needles)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, needles) for v in value]
    return value
