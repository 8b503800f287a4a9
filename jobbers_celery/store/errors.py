"""What a store failure is: an outage (Redis unreachable or refusing writes for now), and how
it leaves the store as :class:`~jobbers_celery.core.errors.StoreUnavailable`.

Why here: only the store imports redis, so only the store can tell its errors apart; the
code above catches :data:`StoreError` or :class:`StoreUnavailable` and never names redis.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

import redis

from jobbers_celery.core.errors import StoreUnavailable
from jobbers_celery.store.fastcall import WritesRefused, as_refusal

__all__ = ["UNREACHABLE", "StoreError", "StoreValueError", "WritesRefused", "is_outage",
           "store_call"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Any error a store call raises about the store (redis-py's base class).
StoreError = redis.RedisError
#: A value the store's client cannot send (about the value, never an outage).
StoreValueError = redis.exceptions.DataError

#: What a store call raises when Redis cannot be reached (or went away during the call), or
#: refuses writes for now: ``OOM`` (``maxmemory`` reached), ``READONLY`` (a replica),
#: ``MASTERDOWN`` (a replica cut off from its master), ``MISCONF``/``NOREPLICAS``/``BUSY``
#: (``WritesRefused``: the lifecycle steps, heartbeats and liveness refreshes raise it, other
#: calls redis-py's plain ``ResponseError``; :func:`is_outage` tells those too), or, on Redis
#: Cluster, cannot serve the slot now. A script refused so wrote nothing: all of them are a
#: store outage, never a task's failure.
UNREACHABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError, WritesRefused,
    # Redis Cluster: CLUSTERDOWN, TRYAGAIN (a slot being resharded), and redis-py's
    # "TTL exhausted" after following redirections that long
    redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
)


def is_outage(exc: BaseException) -> bool:
    """``exc`` means the store cannot be reached or take writes for now (see UNREACHABLE),
    whichever call raised it (redis-py's own calls raise ``MISCONF`` and the like as a
    plain ``ResponseError``)."""
    return isinstance(exc, UNREACHABLE) or as_refusal(exc) is not None


#: Per redis-py (or OSError) class, that class made a StoreUnavailable too.
_UNAVAILABLE: dict[type[BaseException], type[StoreUnavailable]] = {}


def _unavailable_type(cls: type[BaseException]) -> type[StoreUnavailable]:
    """``cls`` that is also a :class:`StoreUnavailable`: same name and module (logs and
    Celery's exception serialisation read as before), pickled as plain ``cls``."""
    made = _UNAVAILABLE.get(cls)
    if made is None:
        def __reduce__(self: BaseException) -> tuple[Any, ...]:
            return cls, self.args, self.__dict__ or None

        made = cast("type[StoreUnavailable]", type(
            cls.__name__, (StoreUnavailable, cls),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
             "__reduce__": __reduce__}))
        made = _UNAVAILABLE.setdefault(cls, made)
    return made


def _as_unavailable(exc: BaseException) -> StoreUnavailable | None:
    """``exc`` as a :class:`StoreUnavailable` that is still of its own class."""
    try:
        kind = _unavailable_type(type(exc))
        unavailable = kind.__new__(kind, *exc.args)
    except TypeError:  # a class that cannot be combined (none of redis-py's or OSError's)
        return None
    unavailable.__dict__.update(vars(exc))
    return unavailable


def store_call(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A failing Redis call leaves ``method`` as :class:`StoreUnavailable` (see there)."""

    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except StoreUnavailable:
            raise
        except (StoreError, OSError) as exc:
            unavailable = _as_unavailable(exc)
            if unavailable is None:
                raise
            try:
                raise unavailable.with_traceback(exc.__traceback__) from exc.__cause__
            finally:
                # the traceback holds this frame: a name left bound to the error would be a
                # cycle keeping the Jobbers (and its app) alive until the collector runs
                del unavailable

    return call
