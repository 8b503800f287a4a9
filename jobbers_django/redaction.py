"""Arguments that look like secrets are shown redacted wherever people read them, and long
ones cut.

Only the display is redacted and cut: the stored arguments stay whole, because resubmission
needs the real values. Keys match when they contain one of ``JOBBERS_REDACT_KEYS``
(case-insensitive, ``-`` and ``_`` alike), at any depth of dicts and lists. A value whose
JSON is longer than ``JOBBERS_DISPLAY_MAX_CHARS`` is cut to about that many characters,
keeping its shape (a list stays a list): long strings end with, and lists and dicts gain,
a ``[cut for display: ...]`` marker saying how much there was.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from jobbers_django import conf

REDACTED = "********"
#: What a cut value says, with how much it held.
CUT = "[cut for display: {}]"


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


def display(value: Any, limit: int | None = None) -> tuple[Any, bool]:
    """``value`` as people see it: redacted, then cut to about ``limit`` characters of JSON
    (default ``JOBBERS_DISPLAY_MAX_CHARS``; 0: never cut). Returns it and whether it was cut."""
    shown = redact(value)
    limit = conf.get("DISPLAY_MAX_CHARS") if limit is None else limit
    if not limit or len(json.dumps(shown, ensure_ascii=False, default=str)) <= limit:
        return shown, False
    return _cut(shown, [int(limit)]), True


def _cut(value: Any, left: list[int]) -> Any:
    """``value`` within the characters ``left[0]`` still allows (and what it used taken off)."""
    if isinstance(value, str):
        if len(value) + 4 <= left[0]:  # quotes and the ", " after it
            left[0] -= len(value) + 4
            return value
        keep, left[0] = max(left[0] - 2, 0), 0
        return value[:keep] + "... " + CUT.format(f"{len(value):,} characters in all")
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for n, (key, item) in enumerate(value.items()):
            if left[0] <= 0:
                out["..."] = CUT.format(_more(len(value) - n, "key"))
                break
            left[0] -= len(str(key)) + 4
            out[key] = _cut(item, left)
        return out
    if isinstance(value, list | tuple):
        items: list[Any] = []
        for n, item in enumerate(value):
            if left[0] <= 0:
                items.append("... " + CUT.format(_more(len(value) - n, "item")))
                break
            items.append(_cut(item, left))
        return items
    left[0] -= len(json.dumps(value, default=str)) + 2  # and the ", " after it
    return value


def _more(n: int, what: str) -> str:
    return f"{n:,} more {what}{'' if n == 1 else 's'}"
