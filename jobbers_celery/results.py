"""Write a JobbersTask's result in the same script as its ``completed`` step.

Why: completing a task used to cost three round trips in the pool child: the ``completed``
step, then Celery's Redis backend storing the result (a GET, so that a stored SUCCESS is never
overwritten, then ``MULTI SETEX PUBLISH EXEC``). When the task's backend is Celery's own
``RedisBackend`` on the same Redis server and db as the jobbers store, one script does the step
and exactly that write, atomically: one round trip, and the record and the result cannot
disagree. The meta is built and encoded by the backend's own methods; only the final write
moves into the script. Anything else (another server or db, another backend class, a non-JSON
or compressed result, a chord, callbacks or a chain to publish before the result is stored,
an ignored result) keeps Celery's normal path.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import states
from celery.app import task as celery_task
from celery.backends.redis import RedisBackend
from kombu.exceptions import EncodeError
from redis.connection import SSLConnection, UnixDomainSocketConnection

from jobbers_celery.store import ResultWrite

if TYPE_CHECKING:
    from celery import Task

    from jobbers_celery.store import RedisStore

__all__ = ["folded_result"]

log = logging.getLogger("jobbers.results")

#: Celery's own rule (request option over task option) for whether a result is stored.
_ignore_result: Callable[[Any, Any], bool] = celery_task.get_actual_ignore_result  # type: ignore[attr-defined]

#: Per backend instance (Celery keeps one per thread): can its writes be folded?
_eligible: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _endpoint(kwargs: dict[str, Any], cls: Any) -> tuple[Any, ...]:
    """What identifies the data a connection sees (and whose keys it may write)."""
    kind = ("unix" if isinstance(cls, type) and issubclass(cls, UnixDomainSocketConnection)
            else "ssl" if isinstance(cls, type) and issubclass(cls, SSLConnection) else "tcp")
    if kind == "unix":
        where: tuple[Any, ...] = (kwargs.get("path"),)
    else:
        where = (kwargs.get("host") or "localhost", int(kwargs.get("port") or 6379))
    return (kind, *where, int(kwargs.get("db") or 0), kwargs.get("username") or None)


def _why_not(store: RedisStore, backend: Any) -> str | None:
    """Why ``backend``'s writes cannot be folded into the store's steps; ``None`` if they can."""
    cls: Any = type(backend)
    if cls is not RedisBackend:  # subclasses (sentinel, custom) may write otherwise
        return f"the result backend is {cls.__name__}, not Celery's RedisBackend"
    if backend.serializer != "json" or backend.compression:
        return "results are not plain JSON (result_serializer or result_compression)"
    pool = store.client.connection_pool
    mine = _endpoint(pool.connection_kwargs, pool.connection_class)
    params = backend.connparams
    theirs = _endpoint(params, params.get("connection_class"))
    if mine != theirs:
        return "the result backend is not on the jobbers Redis server and db"
    return None


def _can_fold(store: RedisStore, backend: Any) -> bool:
    known = _eligible.get(backend)
    if known is None:
        why = _why_not(store, backend)
        known = why is None
        _eligible[backend] = known
        if known:
            log.info("JobbersTask results are written by the completed step (same Redis)")
        else:
            log.info("JobbersTask results are written by Celery's backend: %s", why)
    return known


def folded_result(task: Task[Any, Any], store: RedisStore, retval: Any) -> ResultWrite | None:
    """The result write to fold into this request's ``completed`` step, or ``None``.

    ``None`` means Celery's tracer stores the result itself, as for any task.
    """
    req: celery_task.Context = task.request
    if _ignore_result(task, req):
        return None
    if req.chord or req.callbacks or req.chain:
        return None  # published before the result is stored, and chords count parts
    backend: Any = task.backend
    if not _can_fold(store, backend):
        return None
    try:
        value = backend.encode_result(retval, states.SUCCESS)
        meta = backend._get_result_meta(result=value, state=states.SUCCESS, traceback=None,
                                        request=req)
        meta["task_id"] = str(req.id)
        encoded = backend.encode(meta)
    except EncodeError:
        return None  # the tracer's own store raises it again and records the failure
    if not isinstance(encoded, str) or len(encoded) > backend._MAX_STR_VALUE_SIZE:
        return None
    key: Any = backend.get_key_for_task(req.id)
    return ResultWrite(
        key=key.decode() if isinstance(key, bytes) else str(key),
        value=encoded,
        expires=int(backend.expires or 0),
    )
