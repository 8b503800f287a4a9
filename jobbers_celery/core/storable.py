"""The storable form of a dead letter: what every bundled sink can store, altered visibly.

A publisher chooses a task's id, arguments, queue and (through the task's code) its exception
message, and some of what it can choose no store takes: PostgreSQL refuses ``NaN`` and
``Infinity`` in JSON, NUL in text and JSON, lone surrogates anywhere (they are not UTF-8, so
Redis refuses them too), more than 255 characters in an id column, numbers outside 32 bits in
an integer column, and arguments nested too deep make ``json.dumps`` itself fail.
:func:`storable_form` returns the entry unchanged when none of that is in it, else a copy where:

- a non-finite float is the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``;
- NUL and lone surrogates are escaped as the six characters ``\\u0000``, ``\\ud800``...;
- an id, name, queue, worker or exception type over :data:`ID_LIMIT` characters is cut to
  its start, ``…`` and 12 hex digits of its SHA-256 (two long ids stay apart), its whole
  (escaped) value kept in ``options[ALTERED]["full"]``; so is a version, attempt or retry
  count outside 32 bits (the count then set to the nearest bound, the version to none);
- a container nested deeper than :data:`MAX_DEPTH` levels, or past :data:`MAX_VALUES` values
  in one field, is the placeholder string :data:`TOO_DEEP` or :data:`TOO_MANY`; a value
  JSON has no form for is its ``str()``, cut to :data:`ID_LIMIT` characters;
- ``options[ALTERED]["fields"]`` names every field altered, and when one of them is what a
  resubmit would publish (arguments, checkpoint, options, id, name, queue, version), the
  entry is :data:`~jobbers_celery.core.records.UNPUBLISHABLE`: publishing altered values would
  run the task with values it was never given.

The walk is iterative and bounded (no recursion; at most :data:`MAX_VALUES` values per
field), so a hostile value costs time linear in its size, whatever its shape. Pure: no
Redis, no Celery, no Django.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from typing import Any

from jobbers_celery.core.records import ALTERED, UNPUBLISHABLE, DeadLetter

__all__ = ["ID_LIMIT", "MAX_DEPTH", "MAX_VALUES", "TOO_DEEP", "TOO_MANY", "is_storable",
           "parked_json", "storable_form", "storable_id", "storable_text", "storable_value"]

#: The longest id, name, queue, worker or exception type stored as is (the columns' size).
ID_LIMIT = 255
#: Containers deeper than this (the field's own value is level 1) become :data:`TOO_DEEP`.
MAX_DEPTH = 100
#: Values (containers and leaves) kept per field; a container that would pass it becomes
#: :data:`TOO_MANY`.
MAX_VALUES = 1_000_000
TOO_DEEP = f"[jobbers: nested deeper than {MAX_DEPTH} levels, not stored]"
TOO_MANY = f"[jobbers: more than {MAX_VALUES} values, not stored]"
#: Integers with more bits than this have no JSON form ``json`` writes (4300 digits).
_INT_BITS = 13_000
_INT32 = (-(2**31), 2**31 - 1)
_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")
_ESCAPES = {c: f"\\u{c:04x}" for c in (0, *range(0xD800, 0xE000))}
_IDS = ("task_id", "name", "queue", "worker", "exception_type")
_TEXTS = ("reason", "exception_message", "traceback")
_VALUES = ("args", "kwargs", "checkpoint", "options")
#: Fields a resubmit publishes: altering one makes the entry unpublishable.
_PUBLISHED = frozenset({"task_id", "name", "queue", "version", "args", "kwargs",
                        "checkpoint", "options"})


def storable_text(text: str) -> str:
    """``text`` with NUL and lone surrogates escaped (``\\u0000``); ``text`` itself when it
    has none."""
    if _UNSTORABLE_CHARS.search(text) is None:
        return text
    return text.translate(_ESCAPES)


def storable_value(value: Any) -> Any:
    """``value`` (an argument, a checkpoint) as :func:`storable_form` stores it: itself when
    every sink takes it, else a copy with each value altered as the module docstring says.
    Also what people are shown of values opened from a seal (sealed raw, they never went
    through the storable form): strict JSON, UTF-8."""
    return _clean(value) if _needs_change(value) else value


def storable_id(task_id: str) -> str:
    """The id a dead letter of ``task_id`` is stored under, as :func:`storable_form` makes
    it (NUL and lone surrogates escaped, over :data:`ID_LIMIT` characters cut with a hash):
    what a lookup by the task's own id must look for. Idempotent."""
    text = storable_text(task_id)
    return _cut(text) if len(text) > ID_LIMIT else text


def storable_form(entry: DeadLetter) -> DeadLetter:
    """``entry`` itself when every sink can store it as it is, else its storable form (see
    the module docstring). Idempotent: the storable form is returned as it is."""
    if is_storable(entry):
        return entry
    changes: dict[str, Any] = {}
    full: dict[str, str] = {}
    for name in _IDS:
        value = getattr(entry, name)
        if value is None:
            continue
        text = storable_text(value if isinstance(value, str) else str(value))
        if len(text) > ID_LIMIT:
            full[name] = text
            text = _cut(text)
        if text != value:
            changes[name] = text
    for name in _TEXTS:
        value = getattr(entry, name)
        if isinstance(value, str) and (text := storable_text(value)) != value:
            changes[name] = text
    for name in _VALUES:
        value = getattr(entry, name)
        if (clean := storable_value(value)) is not value:
            changes[name] = clean
    for name in ("attempt", "retry_attempt"):
        value = getattr(entry, name)
        if not _count_ok(value):
            low = 0
            full[name] = storable_text(str(value))[:ID_LIMIT]
            changes[name] = (min(max(value, low), _INT32[1]) if isinstance(value, int)
                             else low)
    version = entry.version
    if not _version_ok(version):
        full["version"] = storable_text(str(version))[:ID_LIMIT]
        changes["version"] = None
    if not changes:
        return entry
    options = changes.get("options", entry.options)
    options = dict(options) if isinstance(options, dict) else {"options": options}
    options[ALTERED] = {"fields": sorted(changes), **({"full": full} if full else {})}
    published = sorted(_PUBLISHED.intersection(changes))
    if published and not options.get(UNPUBLISHABLE):
        options[UNPUBLISHABLE] = (f"stored altered ({', '.join(published)}): publishing it "
                                  "would run the task with values other than its own")
    changes["options"] = options
    return dataclasses.replace(entry, **changes)


def is_storable(entry: DeadLetter) -> bool:
    """Whether :func:`storable_form` returns ``entry`` itself: the same checks, nothing
    built (what a normal entry costs)."""
    return (all(_id_ok(getattr(entry, name)) for name in _IDS)
            and all(not isinstance(v := getattr(entry, name), str)
                    or _UNSTORABLE_CHARS.search(v) is None for name in _TEXTS)
            and not any(_needs_change(getattr(entry, name)) for name in _VALUES)
            and _count_ok(entry.attempt) and _count_ok(entry.retry_attempt)
            and _version_ok(entry.version))


def _id_ok(value: Any) -> bool:
    return value is None or (isinstance(value, str) and len(value) <= ID_LIMIT
                             and _UNSTORABLE_CHARS.search(value) is None)


def _count_ok(value: Any) -> bool:
    return isinstance(value, int) and 0 <= value <= _INT32[1]


def _version_ok(value: Any) -> bool:
    return value is None or (isinstance(value, int) and _INT32[0] <= value <= _INT32[1])


def parked_json(entry: DeadLetter) -> str:
    """The JSON an entry is parked as (outbox, spool, set-aside list): the entry as it is
    (``NaN``, escaped NUL and surrogates read back the same), or its storable form when
    ``json`` cannot write it (nested too deep, an integer of thousands of digits)."""
    try:
        return json.dumps(entry.to_json(), default=str, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        return json.dumps(storable_form(entry).to_json(), default=str, separators=(",", ":"))


def _cut(text: str) -> str:
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{text[:ID_LIMIT - 13]}…{digest}"


def _float(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _leaf_ok(value: Any) -> bool | None:
    """Whether a non-container is stored as it is; ``None`` for a container."""
    kind = type(value)  # the exact JSON types first: one lookup each, most values
    if kind is str:
        return _UNSTORABLE_CHARS.search(value) is None
    if kind is float:
        return math.isfinite(value)
    if kind is int:
        return bool(value.bit_length() <= _INT_BITS)
    if kind is list or kind is dict:
        return None
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, str):
        return _UNSTORABLE_CHARS.search(value) is None
    if isinstance(value, int):
        return value.bit_length() <= _INT_BITS
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict | list | tuple):
        return None
    return False


def _needs_change(value: Any) -> bool:
    """Whether :func:`_clean` would change ``value``: the same walk, without building."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    counted = 1
    while stack:
        item, depth = stack.pop()
        ok = _leaf_ok(item)
        if ok is not None:
            if not ok:
                return True
            continue
        if depth >= MAX_DEPTH:
            return True
        counted += len(item)
        if counted > MAX_VALUES:
            return True
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str) or _UNSTORABLE_CHARS.search(key) is not None:
                    return True
                stack.append((child, depth + 1))
        else:
            stack.extend((child, depth + 1) for child in item)
    return False


def _clean(value: Any) -> Any:
    """The storable copy of ``value`` (containers rebuilt, leaves replaced)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]
    counted = 1
    while stack:
        item, parent, slot, depth = stack.pop()
        ok = _leaf_ok(item)
        if ok is not None:
            parent[slot] = item if ok else _leaf(item)
            continue
        if depth >= MAX_DEPTH:
            parent[slot] = TOO_DEEP
            continue
        if counted + len(item) > MAX_VALUES:
            parent[slot] = TOO_MANY
            continue
        counted += len(item)
        # leaves are settled here, containers wait on the stack (in order)
        children: list[tuple[Any, Any, Any, int]] = []
        if isinstance(item, dict):
            out: dict[str, Any] = {}
            for key, child in item.items():
                name = _key(key)
                while name in out:  # two keys escaped alike: keep both
                    name += "~"
                ok = _leaf_ok(child)
                out[name] = child if ok else (None if ok is None else _leaf(child))
                if ok is None:
                    children.append((child, out, name, depth + 1))
            parent[slot] = out
        else:
            seq: list[Any] = []
            for child in item:
                kind = type(child)  # the common cases inline: a million values
                if kind is str:
                    seq.append(storable_text(child))
                    continue
                if kind is float:
                    seq.append(child if child - child == 0 else _float(child))
                    continue
                ok = _leaf_ok(child)
                if ok is None:
                    children.append((child, seq, len(seq), depth + 1))
                seq.append(child if ok else (None if ok is None else _leaf(child)))
            parent[slot] = seq
        stack.extend(reversed(children))
    return root[0]


def _leaf(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, int):
        return f"[jobbers: an integer of {value.bit_length()} bits, not stored]"
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - any object: its type says enough
        text = f"[jobbers: a {type(value).__name__}, not stored]"
    return storable_text(text[:ID_LIMIT])


def _key(key: Any) -> str:
    if isinstance(key, str):
        return storable_text(key)
    if key is None or isinstance(key, bool):
        return {None: "null", True: "true", False: "false"}[key]
    if isinstance(key, float):
        return str(_float(key))
    return str(_leaf(key))
