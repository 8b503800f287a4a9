"""Rate limits keyed by arguments (``rate_limit_by=RateLimit("10/s", key="account_id")``):
the rate's text, the key's digest, and the window's arithmetic. Pure.

The limit is counted in the store, shared by every worker (Celery's own ``rate_limit`` is
per worker and has no key, and stays as Celery has it). A key's value is user data (it may
be a secret, and its size is the publisher's choice): only a digest of its canonical JSON,
bounded before it is hashed, ever reaches a Redis key or a history entry.

The window is a sliding log (see ``docs/howto/rate-limits.md``): a key's starts of the last
period, one sorted-set entry each, so that no window of that length ever holds more than
``count`` starts. :func:`room_at` is the arithmetic the start step's Lua applies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobbers_celery.core import callkey
from jobbers_celery.core.errors import InvalidTaskOption, JobbersError
from jobbers_celery.core.keydigest import MAX_KEY_BYTES, canonical_digest

__all__ = [
    "MAX_COUNT",
    "MAX_KEY_BYTES",
    "MAX_RATE_NAME",
    "MAX_RATE_TEXT",
    "OFF",
    "PERIODS_MS",
    "WAIT_GRACE_MS",
    "Rate",
    "RateKey",
    "RateLimit",
    "RateLimitInfo",
    "RateLimitKeyError",
    "describe_key",
    "key_digest",
    "parse_override",
    "parse_rate",
    "room_at",
    "turn_at",
    "validate_rate_limit",
    "wait_place",
]

#: Window length per unit, ms (the units the start step's Lua knows, in ``_lib.lua``).
PERIODS_MS: Mapping[str, int] = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_UNIT_WORDS = {"s": "s", "sec": "s", "second": "s", "m": "m", "min": "m", "minute": "m",
               "h": "h", "hour": "h", "d": "d", "day": "d"}
#: Most starts one window holds (one sorted-set entry each: ~100 bytes, so at most ~10 MB
#: for one key at the top of the range).
MAX_COUNT = 100_000
#: A rate's text is read only up to this length (it comes from the CLI, the admin, a setting).
MAX_RATE_TEXT = 32
#: A task name an override is set for is at most this long (it becomes a hash field).
MAX_RATE_NAME = 200
#: A caller told to wait keeps its place this long past its run_at (ms): it comes back later
#: than that (the scheduler's poll, the broker, the worker's queue), and a newcomer meanwhile
#: must not take the room that was kept for it. Past this it counts as a newcomer.
WAIT_GRACE_MS = 60_000
#: The override that lifts a limit (the task starts unlimited until it is cleared).
OFF = "off"
_WHAT = "the rate-limit key"

_RATE = re.compile(r"\s*(\d{1,7})\s*/\s*([a-z]+)\s*")


class RateLimitKeyError(JobbersError, ValueError):
    """A task's rate-limit key could not be worked out from its arguments (the key function
    raised, the argument is missing, or its value is not JSON or over ``MAX_KEY_BYTES``):
    the task fails at its start without running (never runs unlimited)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` starts per ``unit`` (``s``, ``m``, ``h``, ``d``)."""

    count: int
    unit: str

    @property
    def period_ms(self) -> int:
        return PERIODS_MS[self.unit]

    def __str__(self) -> str:
        return f"{self.count}/{self.unit}"


def parse_rate(text: object) -> Rate:
    """``"10/s"``, ``"5/m"``, ``"100/h"``, ``"1000/d"`` (also ``"5/min"``, ``"1/hour"``...)
    -> :class:`Rate`; raises ``ValueError`` saying what is wrong (read up to
    ``MAX_RATE_TEXT`` characters)."""
    if not isinstance(text, str):
        raise ValueError(  # noqa: TRY004 - one error type for every bad input (400, exit 2)
            f"a rate is text like '10/s', got {type(text).__name__}")
    if len(text) > MAX_RATE_TEXT:
        raise ValueError(f"a rate is at most {MAX_RATE_TEXT} characters, like '10/s'")
    m = _RATE.fullmatch(text.lower())
    if m is None:
        raise ValueError(f"{text!r} is not a rate: write a count per unit, like '10/s', "
                         "'5/m', '100/h' or '1000/d'")
    unit = _UNIT_WORDS.get(m.group(2).removesuffix("s") if len(m.group(2)) > 3
                           else m.group(2))
    if unit is None:
        raise ValueError(f"{text!r}: the unit must be s, m, h or d")
    count = int(m.group(1))
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"{text!r}: the count must be between 1 and {MAX_COUNT}")
    return Rate(count, unit)


def parse_override(text: object) -> str:
    """An operator's override: a rate (its canonical text) or ``"off"``."""
    if isinstance(text, str) and text.strip().lower() == OFF:
        return OFF
    return str(parse_rate(text))


def key_digest(value: Any) -> str:
    """The key's name in the store (see :mod:`jobbers_celery.core.keydigest`)."""
    return canonical_digest(value, _WHAT, RateLimitKeyError)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """The task option ``rate_limit_by``: at most ``rate`` starts per key, across every
    worker. The key (one convention with ``Unique``'s and ``concurrency_key``'s, see
    :mod:`~jobbers_celery.core.callkey`): ``on``, an argument's name or position or a tuple
    of them, or ``key``, a function of ``(args, kwargs)``; neither: one limit for every call
    of the task."""

    rate: Rate | str
    on: callkey.On | None = None
    key: callkey.KeyFunction | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rate, str):
            try:
                object.__setattr__(self, "rate", parse_rate(self.rate))
            except ValueError as exc:
                raise InvalidTaskOption(f"rate_limit_by: {exc}") from None
        elif not isinstance(self.rate, Rate):
            raise InvalidTaskOption(f"rate_limit_by: the rate is text like '10/s', "
                                    f"got {self.rate!r}")
        object.__setattr__(self, "on", callkey.check(self.on, self.key, "rate_limit_by"))

    @property
    def limit(self) -> Rate:
        assert isinstance(self.rate, Rate)  # made so by __post_init__
        return self.rate

    def value_of(self, func: Callable[..., Any] | None, args: Sequence[Any],
                 kwargs: Mapping[str, Any]) -> Any:
        """The key's value for one call (``func``: the task's ``run``, to read an argument
        by its parameter); raises :class:`RateLimitKeyError`."""
        if self.key is not None:
            return callkey.call_key(self.key, args, kwargs, _WHAT, RateLimitKeyError)
        if self.on is None:
            return None
        return callkey.select(self.on, func, args, kwargs, _WHAT, RateLimitKeyError)

    def digest(self, func: Callable[..., Any] | None, args: Sequence[Any],
               kwargs: Mapping[str, Any]) -> str:
        return key_digest(self.value_of(func, args, kwargs))


@dataclass(frozen=True, slots=True)
class RateKey:
    """What a start step is handed for a task with ``rate_limit_by``: its key's digest and
    the declared rate (an operator's override, in the store, wins over it)."""

    digest: str
    rate: Rate


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    """One task name's rate limit as the operators see it: what its code declares (``None``:
    no ``rate_limit_by`` in this process's app), the override in force (``None``: none;
    ``"off"``: lifted), what its key is made of, and how many of its tasks wait on it now."""

    name: str
    declared: str | None
    override: str | None
    key: str
    held: int

    @property
    def effective(self) -> str | None:
        """The rate the next start is held to (``None``: unlimited, or no ``rate_limit_by``
        here: an override is then not applied)."""
        if self.override == OFF or self.declared is None:
            return None
        return self.override or self.declared

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "declared": self.declared, "override": self.override,
                "effective": self.effective, "key": self.key, "held": self.held}


def describe_key(limit: RateLimit | None) -> str:
    """What a limit's key is made of, for the operators (never a value)."""
    if limit is None:
        return "-"
    return callkey.describe(limit.on, limit.key, "one limit for every call")


def validate_rate_limit(value: object) -> RateLimit | None:
    """The option as declared: a :class:`RateLimit`, a rate's text (one limit for every
    call), or ``None``."""
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, str):
        return RateLimit(value)
    raise InvalidTaskOption(f"rate_limit_by must be a RateLimit or a rate like '10/s', "
                            f"got {value!r}")


def room_at(starts: Sequence[int], count: int, period_ms: int, now: int,
            waiting: int = 0) -> int:
    """When a caller of a key finds room (ms; ``now`` if it has room now), the arithmetic of
    ``_lib.lua``'s ``rate_wait``. ``starts``: the key's recorded starts (ms); ``waiting``:
    the callers ahead of this one (see :func:`turn_at`), who take the earlier places.

    The window is ``(now - period, now]``: a start at ``t`` leaves it at ``t + period``.
    Places are numbered on from the recorded starts: place ``j`` is free once place
    ``j - count`` is a period old; this caller takes place ``len(starts) + waiting``."""
    live = sorted(t for t in starts if t > now - period_ms)
    c = len(live)
    j = c + waiting
    top = max(c, count)
    k = (j - top) // count + 1 if j >= top else 0
    j -= k * count
    if k == 0:  # fewer than count started and waiting: room now
        return now
    return max(now, (live[j] if j < c else now) + k * period_ms)


def turn_at(starts: Sequence[int], waiting: Mapping[str, int], caller: str, count: int,
            period_ms: int, now: int, grace_ms: int = WAIT_GRACE_MS) -> int:
    """When ``caller`` of a key finds room (``now``: admitted now), the decision of
    ``_lib.lua``'s ``rate_wait``. ``waiting``: the callers told to wait -> their run_at;
    one whose run_at is more than ``grace_ms`` past is forgotten.

    A newcomer has every waiting caller ahead of it, a run_at still to come or not (those
    past it are on their way back: the room is theirs). A caller back at or after its run_at
    starts whenever the window has room; one back early, or finding no room, has ahead of it
    those told to come back before it. So no caller takes a place kept for an earlier one,
    and a late comer keeps its place."""
    queue = {i: t for i, t in waiting.items() if t > now - grace_ms}
    mine = queue.pop(caller, None)
    if mine is None:
        return room_at(starts, count, period_ms, now, len(queue))
    if mine <= now and room_at(starts, count, period_ms, now) == now:
        return now
    return room_at(starts, count, period_ms, now, sum(1 for t in queue.values() if t < mine))


def wait_place(waiting: Mapping[str, int], caller: str, at: int, now: int,
               grace_ms: int = WAIT_GRACE_MS) -> int:
    """The score ``caller``, told by :func:`turn_at` to wait until ``at``, is entered in the
    waiting set with (``rate_defer``): ``at`` for a newcomer; for a caller told to wait
    before, before the next caller's score (so none behind it gets ahead of it), and no
    earlier than its own."""
    mine = waiting.get(caller)
    if mine is None or mine <= now - grace_ms:
        return at
    after = [t - 1 for i, t in waiting.items() if i != caller and t > mine]
    return max(mine, min([at, *after]))
