"""Write a JobbersTask's result in the same script as its ``completed`` step.

Why: completing a task used to cost three round trips in the pool child: the ``completed``
step, then Celery's Redis backend storing the result (a GET, so that a stored SUCCESS is never
overwritten, then ``MULTI SETEX PUBLISH EXEC``). When the task's backend is Celery's own
``RedisBackend`` on the same Redis server as the jobbers store (the same db, or another db
of it: jobbers' default layout, records on the broker's db and results on another), one
script does the step and exactly that write, atomically: one round trip, and the record and
the result cannot disagree. The meta is built and encoded by the backend's own methods; only
the final write moves into the script. Anything else (another server or user, another backend
class, a non-JSON or compressed result, a chord, callbacks or a chain to publish before the
result is stored, an ignored result) keeps Celery's normal path, at two more round trips per
task: a worker says so once, at start (:func:`check_layout`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import states
from celery.app import task as celery_task
from celery.backends.base import DisabledBackend
from celery.backends.redis import RedisBackend

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.store import ResultWrite
from jobbers_celery.store.connect import endpoint

if TYPE_CHECKING:
    from celery import Task

    from jobbers_celery.store import LayoutStore

__all__ = ["check_layout", "folded_result", "forget", "mark_revoked", "not_folded",
           "stored_by_celery"]

log = escaped_logger("jobbers.results")

#: Celery's own rule (request option over task option) for whether a result is stored.
_ignore_result: Callable[[Any, Any], bool] = celery_task.get_actual_ignore_result  # type: ignore[attr-defined]

#: Why a result write cannot be folded when the result backend is elsewhere.
ELSEWHERE = "the result backend is not on the jobbers Redis server (or uses another user)"


def _fold_db(store: LayoutStore, backend: Any) -> tuple[str | None, int | None]:
    """(why ``backend``'s writes cannot be folded into the store's steps, or ``None`` if
    they can; the result db to select when it is not the store's own)."""
    cls: Any = type(backend)
    if cls is not RedisBackend:  # subclasses (sentinel, custom) may write otherwise
        return f"the result backend is {cls.__name__}, not Celery's RedisBackend", None
    if backend.serializer != "json" or backend.compression:
        return "results are not plain JSON (result_serializer or result_compression)", None
    where = store.endpoint()
    if where is None:
        return ("the jobbers store is a Redis Cluster: Celery's result key is not in the "
                "slot of the task's record"), None
    mine, my_db = where
    params = backend.connparams
    theirs, their_db = endpoint(params, params.get("connection_class"))
    if mine != theirs:
        return ELSEWHERE, None
    return None, (None if their_db == my_db else their_db)


def _why_not(store: LayoutStore, backend: Any) -> str | None:
    """Why ``backend``'s writes cannot be folded into the store's steps; ``None`` if they can."""
    return _fold_db(store, backend)[0]


#: Per backend instance (Celery keeps one per thread): (can its writes be folded, the result
#: db to select when it is not the store's own).
_targets: weakref.WeakKeyDictionary[Any, tuple[bool, int | None]] = weakref.WeakKeyDictionary()


def _target(store: LayoutStore, backend: Any) -> tuple[bool, int | None]:
    known = _targets.get(backend)
    if known is None:
        why, db = _fold_db(store, backend)
        known = (why is None, db)
        _targets[backend] = known
        if why is None:
            log.info("JobbersTask results are written by the completed step (same Redis%s)",
                     f", db {db}" if db is not None else "")
        else:
            log.info("JobbersTask results are written by Celery's backend: %s", why)
    return known


def not_folded(task: Task[Any, Any]) -> None:
    """The script could not write the result (its db could not be selected: an ACL without
    ``SELECT``, or Redis Cluster): Celery writes this one, and every later one."""
    backend: Any = task.backend
    if _targets.get(backend, (True, None))[0]:
        _targets[backend] = (False, None)
        log.warning("JobbersTask results are written by Celery's backend from now on: the "
                    "completed step could not select the result db (SELECT refused)")


def check_layout(store: LayoutStore, backend: Any) -> str | None:
    """At worker start: warn, once, when results cannot be folded into ``completed`` because
    the result backend is on another Redis server (or user): every task then costs two more
    round trips (Celery's GET, then MULTI SETEX PUBLISH EXEC). Returns the reason, if any."""
    if not isinstance(backend, RedisBackend):
        return None  # no Redis result write to fold (no backend, or another kind)
    why = _fold_db(store, backend)[0]
    if why == ELSEWHERE:
        log.warning("jobbers: the completed step cannot carry Celery's result write (%s): "
                    "each task costs two more Redis round trips in the worker. Put "
                    "jobbers_redis_url and result_backend on the same Redis server to fold "
                    "them (see the docs' Redis page, \"Result backend layout\")", why)
    return why


def folded_result(task: Task[Any, Any], store: LayoutStore, retval: Any) -> ResultWrite | None:
    """The result write to fold into this request's ``completed`` step, or ``None``.

    ``None`` means Celery's tracer stores the result itself, as for any task. Raises
    kombu's ``EncodeError`` when the backend cannot encode ``retval``: the attempt ends
    ``failed`` with it, and Celery stores FAILURE, as for a result its own write cannot
    encode.
    """
    req: celery_task.Context = task.request
    if _ignore_result(task, req):
        return None
    if req.chord or req.callbacks or req.chain:
        return None  # published before the result is stored, and chords count parts
    backend: Any = task.backend
    foldable, db = _target(store, backend)
    if not foldable:
        return None
    value = backend.encode_result(retval, states.SUCCESS)
    meta = backend._get_result_meta(result=value, state=states.SUCCESS, traceback=None,
                                    request=req)
    meta["task_id"] = str(req.id)
    encoded = backend.encode(meta)  # raises EncodeError as Celery's own write would
    if not isinstance(encoded, str) or len(encoded) > backend._MAX_STR_VALUE_SIZE:
        return None
    key: Any = backend.get_key_for_task(req.id)
    return ResultWrite(
        key=key.decode() if isinstance(key, bytes) else str(key),
        value=encoded,
        expires=int(backend.expires or 0),
        db=db,
    )


def stored_by_celery(task: Task[Any, Any]) -> bool:
    """Whether Celery's tracer stores this request's result (not folded): it does unless
    the result is ignored or the app has no result backend. The completion is then
    recorded after that write, so that the record follows what Celery stored."""
    return not (_ignore_result(task, task.request) or isinstance(task.backend, DisabledBackend))


def forget(task: Task[Any, Any], task_id: str) -> None:
    """Remove the result Celery's tracer just stored for an attempt whose completion the
    record refused (another attempt or outcome owns it), so that the result does not
    contradict the record and the attempt that owns it can store its own. A backend that
    cannot forget keeps it (logged)."""
    try:
        task.backend.forget(task_id)
    except Exception:
        log.warning("the completion of %s[%s] was refused, but the result it stored could not "
                    "be removed: the result backend keeps it", task.name, task_id,
                    exc_info=True)


def mark_revoked(backend: Any, task_id: str, reason: str) -> bool:
    """Celery's result backend says REVOKED for a task jobbers cancelled before any worker
    ran it (``Jobbers.cancel`` of a submitted or scheduled task), as Celery's own revoke
    does, so that ``AsyncResult(id).state`` agrees with the record. A write that fails is
    logged, never raised: the cancellation, already recorded, stands. Returns whether it
    was written."""
    try:
        backend.mark_as_revoked(task_id, reason, store_result=True)
    except Exception:
        log.warning("task %s is cancelled, but the result backend could not be told: it "
                    "still shows the state it had", task_id, exc_info=True)
        return False
    return True
