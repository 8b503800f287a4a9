"""How a task's reported progress is shown: as a bar where it is a part of a whole, as short
readable text where it is not (pages, ``celery jobbers``, the workers view).

A task reports any JSON value (``self.heartbeat(progress=...)``). The rule, in order:

- ``{x: n, "of" | "total": d}`` for any key name ``x`` (``{"chunk": 11, "of": 60}``,
  ``{"batch": 51, "total": 400}``, ``{"done": 3, "of": 8}``): ``n`` of ``d``, a bar at
  ``n / d`` (kept within 0..1; the label still says the numbers). ``x`` is ``done`` if the
  mapping has it, else its first number in the task's own order; the other keys follow in
  the label. ``d`` must be a number above 0.
- ``{"percent": p}``: ``p %``; ``{"fraction": f}`` (0..1): ``f`` as a percentage.
- A bare number is a **counter** (``progress=1`` reads ``1``, never ``100%``), with no bar.
- Anything else reads as compact ``key: value`` text (``phase: upload, file: a.csv``), no
  bar.

Every label is cut to :data:`LABEL_MAX` characters and shows control characters escaped
(:func:`~jobbers_celery.core.printable.printable`); a page escapes HTML on top. The value has
already been bounded when it was stored (``PROGRESS_MAX_BYTES``) and redacted by the caller.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from jobbers_celery.core.printable import printable

__all__ = ["LABEL_MAX", "ProgressShown", "progress_shown"]

LABEL_MAX = 120
_DENOMINATORS = ("of", "total")
_ELLIPSIS = "..."


@dataclass(frozen=True)
class ProgressShown:
    """``fraction``: 0..1 to draw as a bar, or ``None`` (no bar: a counter, or text);
    ``label``: what a person reads, bounded and printable."""

    fraction: float | None
    label: str

    @property
    def percent(self) -> int | None:
        """The bar's width in whole percent (``None`` without a bar)."""
        return None if self.fraction is None else math.floor(100 * self.fraction)


def progress_shown(value: Any) -> ProgressShown | None:
    """The progress as shown, or ``None`` when the task reported none."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return _mapping(value)
    return ProgressShown(None, _cut(_scalar(value)))


def _mapping(value: Mapping[Any, Any]) -> ProgressShown:
    for name in _DENOMINATORS:
        whole = value.get(name)
        if _number(whole) and _finite(whole) and whole > 0:
            part_key = _part_key(value)
            if part_key is not None:
                part = value[part_key]
                rest = _pairs(value, skip={part_key, name})
                counted = (f"{_number_text(part)} of {_number_text(whole)} done"
                           if part_key == "done" else
                           f"{_key_text(part_key)} {_number_text(part)} of {_number_text(whole)}")
                label = counted + (f", {rest}" if rest else "")
                return ProgressShown(_ratio(part, whole), _cut(label))
    percent, fraction = value.get("percent"), value.get("fraction")
    if _number(percent) and _finite(percent):
        rest = _pairs(value, skip={"percent"})
        label = f"{_number_text(percent)}%" + (f", {rest}" if rest else "")
        return ProgressShown(_clamp(percent / 100), _cut(label))
    if _number(fraction) and _finite(fraction):
        rest = _pairs(value, skip={"fraction"})
        label = f"{_number_text(round(100 * fraction, 1))}%" + (f", {rest}" if rest else "")
        return ProgressShown(_clamp(fraction), _cut(label))
    return ProgressShown(None, _cut(_pairs(value, skip=set()) or "{}"))


def _part_key(value: Mapping[Any, Any]) -> Any:
    """``done`` if it is a number, else the first finite number's key (not a denominator)."""
    done = value.get("done")
    if _number(done) and _finite(done):
        return "done"
    for key, item in value.items():
        if key not in _DENOMINATORS and _number(item) and _finite(item):
            return key
    return None


def _pairs(value: Mapping[Any, Any], skip: set[Any]) -> str:
    """``key: value, key: value`` in the task's order, stopping once past the bound."""
    parts: list[str] = []
    size = 0
    for key, item in value.items():
        if key in skip:
            continue
        part = f"{_key_text(key)}: {_scalar(item)}"
        parts.append(part)
        size += len(part) + 2
        if size > LABEL_MAX:
            break
    return ", ".join(parts)


def _key_text(key: Any) -> str:
    return str(key)[:LABEL_MAX + 1] if isinstance(key, str) else _scalar(key)


def _scalar(value: Any) -> str:
    """A value on one short line: numbers as numbers, text as is, the rest as compact JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if _number(value):
        return _number_text(value)
    if isinstance(value, str):
        return value[:LABEL_MAX + 1]
    if value is None:
        return "null"
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError):
        text = type(value).__name__
    return text[:LABEL_MAX + 1]


def _number_text(value: float) -> str:
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else f"~2^{value.bit_length() - 1}"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else f"{value:.6g}"


def _cut(text: str) -> str:
    """At most :data:`LABEL_MAX` characters, control characters escaped (cut first, so the
    escaping costs no more than the bound)."""
    shown = printable(text[:LABEL_MAX + 1])
    return shown if len(shown) <= LABEL_MAX else shown[:LABEL_MAX - len(_ELLIPSIS)] + _ELLIPSIS


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: float) -> bool:
    """A number a float holds (``math.isfinite`` raises OverflowError for an int past
    2**1024, which a task's progress can carry: ``{"percent": 10**400}``)."""
    if isinstance(value, int):
        return value.bit_length() <= 1000
    return math.isfinite(value)


def _ratio(part: float, whole: float) -> float:
    try:
        return _clamp(part / whole)
    except OverflowError:  # a part beyond what a float holds: past the whole, or below 0
        return 1.0 if part > 0 else 0.0


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, float(value)))
