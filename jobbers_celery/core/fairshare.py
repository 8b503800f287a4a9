"""Fair shares: ``max_concurrent`` per key (``concurrency_key=``), the key's digest. Pure.

A task declared ``max_concurrent=4, concurrency_key="account_id"`` runs at most 4 at once
*per account*; a start past its key's cap is parked (``submitted -> scheduled``, no retry
used) in its key's first-in-first-out list until one of that key's runs ends, instead of
being deferred and re-published every second (see ``docs/howto/fair-shares.md``).

The key's value is user data (it may be a secret, and its size is the publisher's choice):
only the SHA-256 of its canonical JSON (sorted keys, no spaces), bounded before it is
hashed, reaches a Redis key, a history reason or a page. The digest is fixed-length hex,
so a key name made of it and the task name needs no separator a value could forge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobbers_celery.core import callkey
from jobbers_celery.core.errors import InvalidTaskOption, JobbersError
from jobbers_celery.core.keydigest import MAX_KEY_BYTES, canonical_digest

__all__ = [
    "DIGEST_LEN",
    "MAX_KEY_BYTES",
    "ConcurrencyKey",
    "ConcurrencyKeyError",
    "FairHeld",
    "FairKey",
    "Released",
    "key_digest",
    "validate_concurrency_key",
]

#: Length of a key digest (hex SHA-256).
DIGEST_LEN = 64

#: ``concurrency_key=``: what ``RateLimit``'s ``on`` takes (a name, a position, a tuple of
#: them), or its ``key`` (a function of ``(args, kwargs)``).
KeySpec = callkey.On | callkey.KeyFunction
_WHAT = "the concurrency key"


class ConcurrencyKeyError(JobbersError, ValueError):
    """A task's concurrency key could not be made from its arguments (the argument is
    missing, the key function raised, or the value is not JSON or over ``MAX_KEY_BYTES``):
    the task fails rather than run outside its key's cap."""


def key_digest(value: Any) -> str:
    """The key's name in the store (see :mod:`jobbers_celery.core.keydigest`)."""
    return canonical_digest(value, _WHAT, ConcurrencyKeyError)


@dataclass(frozen=True, slots=True)
class ConcurrencyKey:
    """What a call's concurrency key is (see :mod:`~jobbers_celery.core.callkey`): an
    argument's name, its position, a tuple of them, or a function of ``(args, kwargs)``."""

    key: KeySpec

    def __post_init__(self) -> None:
        key: object = self.key
        if isinstance(key, list):
            key = tuple(key)
        if not (callable(key) or callkey.is_on(key)):
            raise InvalidTaskOption("concurrency_key must be an argument name, a position "
                                    "(>= 0), a non-empty tuple of them or a function of "
                                    f"(args, kwargs), got {self.key!r}")
        object.__setattr__(self, "key", key)

    def value(self, run: Callable[..., Any] | None, args: Sequence[Any],
              kwargs: Mapping[str, Any]) -> Any:
        """The key's value for a call of ``run`` (the task's function, to read an argument
        by its parameter); raises :class:`ConcurrencyKeyError`."""
        key = self.key
        if callable(key):
            return callkey.call_key(key, args, kwargs, _WHAT, ConcurrencyKeyError)
        return callkey.select(key, run, args, kwargs, _WHAT, ConcurrencyKeyError)

    def digest(self, run: Callable[..., Any] | None, args: Sequence[Any],
               kwargs: Mapping[str, Any]) -> str:
        return key_digest(self.value(run, args, kwargs))


def validate_concurrency_key(value: Any, max_concurrent: int | None) -> ConcurrencyKey | None:
    """The task option ``concurrency_key``: ``None``, what :class:`ConcurrencyKey` takes,
    or a :class:`ConcurrencyKey`. It needs ``max_concurrent`` (the cap it keys)."""
    if value is None:
        return None
    if max_concurrent is None:
        raise InvalidTaskOption("concurrency_key needs max_concurrent (the cap per key)")
    return value if isinstance(value, ConcurrencyKey) else ConcurrencyKey(value)


@dataclass(frozen=True, slots=True)
class FairKey:
    """One start's key: its digest and the cap per key (what the start step is given)."""

    digest: str
    cap: int

    @property
    def short(self) -> str:
        """The first 8 hex digits (what history reasons and pages show)."""
        return self.digest[:8]

    @property
    def parked_reason(self) -> str:
        """The history reason of a task parked past its key's cap (``_lib.lua``'s
        ``fair_reason`` writes the same)."""
        return f"key {self.short} at max_concurrent={self.cap}: parked, no retry used"


@dataclass(frozen=True, slots=True)
class FairHeld:
    """What fair shares hold back for one (task name, key): ``parked`` tasks waiting for
    room, ``released`` ones on their way to start, ``running`` ones counted against ``cap``."""

    name: str
    key: str  # the digest's first 8 hex digits
    digest: str
    cap: int
    parked: int
    released: int
    running: int


@dataclass(frozen=True, slots=True)
class Released:
    """A release pass's answer: the parked tasks let go (``task id -> (name, digest)``),
    to claim and publish as due, and the Redis time of the pass (ms)."""

    ids: dict[str, tuple[str, str]]
    now_ms: int
