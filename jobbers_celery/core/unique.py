"""Unique tasks: what makes two publishes of a task the same, and until when only one of them
may wait or run. Pure: the spec, its validation, the key digest and the header that carries
them to the publish's store step.

Two publishes are the same when their task name and their *key values* are equal: all the
arguments by their parameters' names (``on=None``), some of them (``on="account"``,
``on=(0, "region")``), or what a function of ``(args, kwargs)`` returns (``key=``), as
:mod:`~jobbers_celery.core.callkey` reads them for every control. The lock is named by a
digest, the SHA-256 of the canonical JSON of ``[name, values]``
(:mod:`~jobbers_celery.core.keydigest`): the key values never reach Redis (arguments can be
secrets), a key name has no separator a value could forge, and its length is fixed. The
canonical text is bounded (:data:`KEY_INPUT_MAX`: ``on=None`` takes every argument) before
it is hashed.

``until``: ``start`` (waiting copies are deduplicated; once one starts, a new one may be
published), ``end`` (the default: until the task reaches a terminal state; a retry keeps
it), ``window`` (``ttl`` seconds from the publish, whatever becomes of the task; a cancel
frees it early). The store releases the lock at that point (see ``_lib.lua``), and a lock
naming a task whose record is gone or past that point counts as free. ``ttl`` is also the
lock's expiry in Redis: the window itself, or for ``start``/``end`` a backstop
(:data:`DEFAULT_HOLD_S` unless given) past which a copy that is still waiting no longer
blocks a new one.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from jobbers_celery.core import callkey
from jobbers_celery.core.errors import InvalidTaskOption, JobbersError
from jobbers_celery.core.keydigest import canonical_digest

__all__ = [
    "DEFAULT_HOLD_S",
    "HEADER_UNIQUE",
    "KEY_INPUT_MAX",
    "DuplicateTask",
    "HeldElsewhere",
    "Unique",
    "UniqueInfo",
    "UniqueKeyError",
    "Until",
    "duplicate_of",
    "field_value",
    "key_digest",
    "parse_field",
    "unique_json",
    "unique_text",
    "validate_unique",
]

#: The message header carrying a publish's lock (``<u>:<ttl ms>:<digest>``, :func:`field_value`);
#: its submit step takes the lock, and keeps the value as the record's field ``uq``.
HEADER_UNIQUE = "jobbers_unique"
#: Bytes of canonical JSON a key may be made of (the selected arguments, or a ``key=``
#: function's value): a bigger one is refused (:class:`UniqueKeyError`), never hashed.
KEY_INPUT_MAX = 1 << 20
#: Expiry, seconds, of an ``until=start``/``end`` lock that sets no ``ttl``: a backstop only
#: (the store releases the lock when its task gets there, or finds its holder gone).
DEFAULT_HOLD_S = 86_400.0
#: The longest ``ttl`` accepted (30 days).
TTL_MAX_S = 30 * 86_400.0

_UNTIL_CODE = {"start": "s", "end": "e", "window": "w"}
_WHAT = "the unique key"


class Until(StrEnum):
    """Until when a unique task's lock is held (see the module)."""

    START = "start"
    END = "end"
    WINDOW = "window"


class UniqueKeyError(JobbersError, ValueError):
    """A unique task's key could not be made from a publish's arguments: a selected
    argument is missing, the key function raised, a value is not JSON, or the key's text is
    over :data:`KEY_INPUT_MAX`."""


class DuplicateTask(JobbersError):
    """Raised by a unique task's publish (``Unique(raise_duplicate=True)``) when another
    copy holds its key: no message was sent. ``holder``: the id of that copy."""

    def __init__(self, name: str, holder: str) -> None:
        super().__init__(f"{name}: a copy with the same unique key is pending ({holder})")
        self.name = name
        self.holder = holder


class HeldElsewhere(BaseException):
    """Raised from the publish's store step (in Celery's publish signal or jobbers'
    producer, which both let a ``BaseException`` through) when another copy holds the
    lock: the message is not sent. ``holder``: that copy's id."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def duplicate_of(why: str | None) -> str | None:
    """The holder's id if a refused step's ``why`` says the lock is held, else ``None``."""
    if why and why.startswith("duplicate:"):
        return why[len("duplicate:"):]
    return None


@dataclass(frozen=True, slots=True)
class Unique:
    """A task's uniqueness (``@app.task(base=JobbersTask, unique=Unique(...))``, or per
    publish: ``apply_async(..., unique=Unique(...))``, ``unique=False`` for none).

    ``on``: the arguments that make the key (``None``: all of them), a name, a position or a
    tuple of them, found however the caller passed them (see
    :mod:`~jobbers_celery.core.callkey`). ``key``: a function of ``(args, kwargs)`` returning
    the key's value (any JSON) instead. ``until``: see :class:`Until`.
    ``ttl``: seconds; the window (required with ``until=window``), else the lock's backstop
    expiry. ``raise_duplicate``: a duplicate publish raises :class:`DuplicateTask`
    instead of returning the holder's ``AsyncResult``.
    """

    on: callkey.On | None = None
    key: callkey.KeyFunction | None = None
    until: Until = Until.END
    ttl: float | None = None
    raise_duplicate: bool = False

    def hold_ms(self) -> int:
        """The lock's expiry in Redis, ms."""
        return max(1, round((DEFAULT_HOLD_S if self.ttl is None else self.ttl) * 1000))


def validate_unique(value: Any, where: str = "unique") -> Unique | None:
    """``value`` (a task option or a publish's) as a checked :class:`Unique`, ``None`` for
    ``None``/``False``; ``True`` means ``Unique()``. Raises :class:`InvalidTaskOption`."""
    if value is None or value is False:
        return None
    if value is True:
        return Unique()
    if not isinstance(value, Unique):
        raise InvalidTaskOption(f"{where} must be a Unique(...), True or None, got {value!r}")
    try:
        until = Until(value.until)
    except ValueError:
        raise InvalidTaskOption(f"{where}: until must be one of start, end, window, got "
                                f"{value.until!r}") from None
    on = callkey.check(value.on, value.key, where)
    if on is not None and not isinstance(on, tuple):
        on = (on,)
    ttl: Any = value.ttl
    if ttl is not None:
        if isinstance(ttl, dt.timedelta):
            ttl = ttl.total_seconds()
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(
                ttl) or not 0 < ttl <= TTL_MAX_S:
            raise InvalidTaskOption(f"{where}: ttl must be seconds in (0, {TTL_MAX_S:.0f}], "
                                    f"got {value.ttl!r}")
        ttl = float(ttl)
    if until is Until.WINDOW and ttl is None:
        raise InvalidTaskOption(f"{where}: until=window needs ttl (the window, seconds)")
    return Unique(on=on, key=value.key, until=until, ttl=ttl,
                  raise_duplicate=bool(value.raise_duplicate))


def key_values(spec: Unique, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
               run: Callable[..., Any] | None = None) -> Any:
    """What the key of a publish with ``args``/``kwargs`` is made of (see :class:`Unique`;
    ``run``: the task's function, to read arguments by their parameter, see
    :mod:`~jobbers_celery.core.callkey`). Raises :class:`UniqueKeyError` for a selected
    argument the publish does not give, or a key function that raises."""
    a, k = tuple(args or ()), dict(kwargs or {})
    if spec.key is not None:
        return ["key", callkey.call_key(spec.key, a, k, _WHAT, UniqueKeyError)]
    if spec.on is None:
        bound = callkey.bind_all(run, a, k)
        return ["all", list(a), k] if bound is None else ["args", bound]
    on = spec.on if isinstance(spec.on, tuple) else (spec.on,)
    values = callkey.select(on, run, a, k, _WHAT, UniqueKeyError)
    return ["on", [[i, v] for i, v in zip(on, values, strict=True)]]


def key_digest(name: str, spec: Unique, args: Sequence[Any] | None,
               kwargs: Mapping[str, Any] | None, run: Callable[..., Any] | None = None) -> str:
    """The lock's name for a publish of task ``name`` (``run``: its function, ``None`` when
    unknown here: arguments as called): hex SHA-256 of the canonical JSON of
    ``[name, key values]``. Raises :class:`UniqueKeyError` (a value not JSON, a text over
    :data:`KEY_INPUT_MAX`, a selected argument missing)."""
    return canonical_digest([name, key_values(spec, args, kwargs, run)], f"{_WHAT} of {name}",
                            UniqueKeyError, KEY_INPUT_MAX)


def field_value(spec: Unique, digest: str) -> str:
    """The header's and the record field ``uq``'s value: ``<s|e|w>:<ttl ms>:<digest>``."""
    return f"{_UNTIL_CODE[spec.until.value]}:{spec.hold_ms()}:{digest}"


@dataclass(frozen=True, slots=True)
class UniqueField:
    """A record's (or a header's) ``uq`` value, read."""

    until: Until
    hold_ms: int
    digest: str


@dataclass(frozen=True, slots=True)
class UniqueInfo:
    """A unique task's lock, as the operators' pages show it: its key's digest (never the
    values it is made of), until when it holds, and the copy holding it now (``None``:
    free; the task itself, or another copy)."""

    digest: str
    until: Until
    hold_ms: int
    holder: str | None


def unique_json(info: UniqueInfo | None, task_id: str) -> dict[str, Any] | None:
    """A task's lock as the CLI's and the REST API's JSON show it (``None``: not unique)."""
    if info is None:
        return None
    return {"key": info.digest, "until": info.until.value, "expires_ms": info.hold_ms,
            "holder": info.holder, "held_by_this_task": info.holder == task_id}


def unique_text(info: UniqueInfo | None, task_id: str) -> str | None:
    """The same in one line for people (the key's first 16 hex digits)."""
    if info is None:
        return None
    who = ("this task" if info.holder == task_id else f"task {info.holder}"
           if info.holder else "nobody (free)")
    return f"key {info.digest[:16]}, until {info.until.value}: held by {who}"


_CODE_UNTIL = {v: Until(k) for k, v in _UNTIL_CODE.items()}


def parse_field(value: Any) -> UniqueField | None:
    """Read a ``uq`` value (outside input: a header or a record), ``None`` if malformed."""
    if not isinstance(value, str) or len(value) > 100:
        return None
    parts = value.split(":")
    if len(parts) != 3 or parts[0] not in _CODE_UNTIL or not parts[1].isascii() \
            or not parts[1].isdigit() or len(parts[1]) > 12 or len(parts[2]) != 64 \
            or int(parts[1]) < 1:  # "²" is a digit int() refuses; PX 0 is refused
        return None
    digest = parts[2]
    if any(c not in "0123456789abcdef" for c in digest):
        return None
    return UniqueField(_CODE_UNTIL[parts[0]], int(parts[1]), digest)
