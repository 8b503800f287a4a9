"""Tracked ``starmap``/``map``: the work ``task.starmap(items)``, ``task.map(items)`` and
``task.chunks(items, n)`` fan out, recorded as part of the canvas.

Why: those canvases publish Celery's builtin ``celery.starmap`` (``chunks``: a group of
them) or ``celery.map`` tasks, plain ``celery.Task`` bodies that call the task directly once
per item, so none of that work was recorded, dead-lettered or resubmittable. ``install(app)``
registers, on that app only, variants of both builtins under the same names whose body is
Celery's, on a :class:`JobbersTask` (:class:`TrackedMap`): each chunk is one tracked task,
recorded (with its root, parent and group like any canvas member), dead-lettered when it fails
(``dead_letter_policy=save``) and resubmitted as a whole chunk, with a heartbeat between items
that shows its progress (``{"done": k, "of": n}``) and honours a cancellation there. Its
result is Celery's: the list of the items' results. The items still run in the chunk's
process, called directly, as in Celery: they are not tasks of their own.

A worker without jobbers runs Celery's builtin for the same message (same name, same
arguments), and an app without ``install`` keeps Celery's builtins untouched.

``celery.chord_unlock`` (the poll that joins a chord on a result backend without a native
chord counter) is wrapped too, on the same app: Celery's body, after a check that keeps the
poll going while a failed header member waits in the dead-letter queue, so that its
resubmit lets the callback run (:func:`jobbers_celery.lifecycle.chords.unlock_verdict`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Task
from celery.canvas import signature
from celery.exceptions import Retry
from celery.result import result_from_tuple

from jobbers_celery.core.options import DeadLetterPolicy
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import chords
from jobbers_celery.worker.task import JobbersTask

if TYPE_CHECKING:
    from collections.abc import Iterable

    from celery import Celery

__all__ = ["MAP", "STARMAP", "UNLOCK", "TrackedMap", "TrackedUnlock", "track_builtins"]

log = escaped_logger("jobbers.canvas")

STARMAP = "celery.starmap"
MAP = "celery.map"
UNLOCK = "celery.chord_unlock"


class TrackedMap(JobbersTask):
    """Base of the tracked ``celery.starmap`` and ``celery.map``: a chunk that fails is
    dead-lettered, so it can be resubmitted whole (from the DLQ, the admin or the API).
    Retries: none of its own (no ``expected_exceptions``), as Celery's builtin: the first
    item that raises fails the chunk."""

    dead_letter_policy = DeadLetterPolicy.SAVE


def _run(chunk: JobbersTask, task: Any, it: Iterable[Any], star: bool) -> list[Any]:
    """Celery's builtin body (``[task(*item) for item in it]``), with a heartbeat after
    each item: its progress on the record, and the chunk's cancellation point."""
    fn: Callable[..., Any] = signature(task, app=chunk.app).type
    items = list(it)
    total = len(items)
    results: list[Any] = []
    for done, item in enumerate(items, 1):
        results.append(fn(*item) if star else fn(item))
        chunk.heartbeat(progress={"done": done, "of": total})
    return results


def starmap(self: JobbersTask, task: Any, it: Iterable[Any]) -> list[Any]:
    """``celery.starmap``, tracked: ``[task(*item) for item in it]``."""
    return _run(self, task, it, star=True)


def xmap(self: JobbersTask, task: Any, it: Iterable[Any]) -> list[Any]:
    """``celery.map``, tracked: ``[task(item) for item in it]``."""
    return _run(self, task, it, star=False)


def track_builtins(app: Celery) -> None:
    """Make ``app``'s ``celery.starmap``, ``celery.map`` and ``celery.chord_unlock`` the
    tracked variants: now if the app is finalized (its builtins are registered), else once
    it is (after Celery registers its own, which the tracked ones then replace). Other apps
    keep Celery's builtins."""
    if app.finalized:  # type: ignore[attr-defined]
        _replace(app)
    else:
        app.on_after_finalize.connect(_on_finalized, sender=app, weak=False)


def _on_finalized(sender: Celery, **_: Any) -> None:
    _replace(sender)


def _replace(app: Celery) -> None:
    tasks: dict[str, Any] = app._tasks  # type: ignore[attr-defined]
    for name, body in ((STARMAP, starmap), (MAP, xmap)):
        if not isinstance(tasks.get(name), TrackedMap):
            tasks.pop(name, None)
            app._task_from_fun(body, name=name, base=TrackedMap, bind=True)
    celerys = tasks.get(UNLOCK)
    if celerys is not None and not isinstance(celerys, TrackedUnlock):
        tasks.pop(UNLOCK)
        app._task_from_fun(_unlock(type(celerys).run), name=UNLOCK, base=TrackedUnlock,
                           bind=True, max_retries=None, ignore_result=True,
                           default_retry_delay=app.conf.result_chord_retry_interval)


class TrackedUnlock(Task):  # type: ignore[type-arg]
    """``celery.chord_unlock`` on an installed app: Celery's poll (a plain task, as Celery's:
    a poll a second is not a lifecycle to record), holding the chord for a member that
    failed into the dead-letter queue."""


def _unlock(celery_run: Callable[..., Any]) -> Callable[..., Any]:
    """The body of the tracked ``chord_unlock``: ``celery_run`` (Celery's own body) after
    :func:`~jobbers_celery.lifecycle.chords.unlock_verdict`."""

    def unlock_chord(self: Task[Any, Any], group_id: str, callback: Any,
                     interval: float | None = None, max_retries: int | None = None,
                     result: list[Any] | None = None, **kwargs: Any) -> Any:
        verdict = _verdict(self.app, callback, result)
        if verdict is chords.Unlock.DONE:
            return None
        if verdict in (chords.Unlock.PENDING, chords.Unlock.WAIT):
            # Celery's own retry of a poll, with its options
            exchange_type = kwargs.get("_chord_unlock_exchange_type")
            options = {} if exchange_type is None else {"exchange_type": exchange_type}
            countdown = self.default_retry_delay if interval is None else interval
            try:
                raise self.retry(countdown=countdown, max_retries=max_retries, **options)
            except Retry:
                raise
            except Exception:  # noqa: BLE001 - no more polls: Celery's body ends the chord
                log.debug("chord %s: its poll cannot be retried; Celery's ends it", group_id)
        return celery_run(self, group_id, callback, interval, max_retries, result, **kwargs)

    return unlock_chord


def _verdict(app: Celery, callback: Any, result: list[Any] | None) -> chords.Unlock:
    jobbers = Jobbers.find(app)
    if jobbers is None or not result:
        return chords.Unlock.CELERY
    try:
        deps = [result_from_tuple(r, app=app) for r in result]
        return chords.unlock_verdict(app, callback, deps, jobbers.store.fields)
    except Exception:  # the backend or the store is out: Celery's poll decides (retries)
        log.warning("chord_unlock: could not check for held members; Celery's poll decides",
                    exc_info=True)
        return chords.Unlock.CELERY
