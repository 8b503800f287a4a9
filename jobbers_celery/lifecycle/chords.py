"""Chord parts held while a header member waits in the dead-letter queue.

Why: Celery's result backends with a native chord counter (``RedisBackend``, and the
key-value backends that count with ``INCR``) count a header member's part when the tracer
stores its outcome (``mark_as_failure``/``mark_as_done`` call ``on_chord_part_return`` when
``request.chord`` is set). A failed part fails the chord's callback with ``ChordError`` once
every part has returned, and a part counts once per task id: a later success of the same
member is ignored. So in plain Celery a chord whose member failed is lost for good.

jobbers holds the part instead when the failure is dead-lettered (``dead_letter_policy=save``):
the member's FAILURE is still stored (``AsyncResult(member).get()`` raises as in Celery) but
its part is not counted, so the callback waits (its ``AsyncResult`` stays PENDING). The
member's message carries the chord again when it is resubmitted (its recorded payload holds
``chord``, ``group_id`` and ``group_index``), so its success counts the part and the callback
runs with every result. A member that stalled never returned its part: it is held already.
Discarding the dead letter of a held member releases its part (:func:`release`): counted
failed, so the chord fails as Celery would have failed it.

Backends without a native counter (the database and filesystem backends, among others)
have the chord's publisher send ``celery.chord_unlock``, which polls the header's states and
fails the callback as soon as every member is ready and one of them failed. There the part is
held by that poll instead (:func:`unlock_verdict`, used by the app's tracked
``chord_unlock``): a member that failed into the dead-letter queue keeps it polling, so the
member's resubmit lets the callback run; a discard fails the callback at once
(:func:`release`), and the poll then ends.

Limits: Celery's Redis chord keys expire ``result_chord_expires`` (default
``result_expires``, one day) after the last part returned: a member resubmitted later
completes, but the callback never runs. A member whose failure is not dead-lettered (policy
``none``, a result Celery could not encode, a revoke) fails the chord as in Celery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

from celery import states
from celery.app.task import Context
from celery.backends.base import BaseBackend
from celery.canvas import maybe_signature
from celery.exceptions import ChordError

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.states import TaskState

__all__ = ["HELD", "DeadLetterDiscarded", "Unlock", "chord_of", "hold", "polls", "releasable",
           "release", "unlock_verdict"]

log = escaped_logger("jobbers.chords")

#: Set on a request whose chord part jobbers holds (read by tests and logs).
HELD = "jobbers_chord_held"

#: States of a task whose failure may hold a chord part (it is in the DLQ, not resubmitted).
_DEAD = frozenset({TaskState.FAILED, TaskState.STALLED, TaskState.DROPPED})

#: Longest task or group id a message may name here (Celery's are 36-character UUIDs).
_MAX_ID = 255


class DeadLetterDiscarded(ChordError):
    """The part a discarded dead letter held, counted failed: what the chord's callback
    fails with when the member's stored result holds no exception to count."""


def hold(request: Any) -> bool:
    """Keep the chord part of ``request`` (a task's ``Context``) from being counted by the
    tracer's ``mark_as_failure``: its failure went to the dead-letter queue, where a
    resubmit can still complete it. Returns whether the request was a chord member."""
    if not getattr(request, "chord", None):
        return False
    request.chord = None
    setattr(request, HELD, True)
    log.info("%s[%s] failed into the dead-letter queue: its chord part (group %s) is held; "
             "resubmit it to let the chord's callback run, or discard its dead letter to "
             "fail the chord", getattr(request, "task", None), request.id,
             getattr(request, "group", None))
    return True


def chord_of(options: Mapping[str, Any]) -> tuple[Any, str, int | None] | None:
    """(the chord's callback, its group id, the member's index) from a recorded payload's
    options, or ``None`` when the task is not a chord header member (or the options are
    not what a Celery message holds: they come from a message, so they are checked)."""
    chord, group_id, index = options.get("chord"), options.get("group_id"), \
        options.get("group_index")
    if not isinstance(chord, dict) or not isinstance(group_id, str) or \
            not 0 < len(group_id) <= _MAX_ID:
        return None
    if not (index is None or (isinstance(index, int) and not isinstance(index, bool))):
        return None
    return chord, group_id, index


def releasable(entries: Iterable[DeadLetter],
               now: Mapping[str, tuple[TaskState, int] | None]) -> list[DeadLetter]:
    """The ``entries`` whose discard releases a held part: chord header members whose record
    is still dead at that entry's attempt (``now``: :meth:`Jobbers.states_of`), so never a
    member resubmitted since (its new run counts the part) nor an older attempt's entry.
    A task whose record expired is released too: nothing can resubmit it any more."""
    found: dict[str, DeadLetter] = {}
    for entry in entries:
        if chord_of(entry.options or {}) is None or not 0 < len(entry.task_id) <= _MAX_ID:
            continue
        state = now.get(entry.task_id)
        if state is None or (state[0] in _DEAD and state[1] == entry.attempt):
            found.setdefault(entry.task_id, entry)
    return list(found.values())


def release(app: Any, entries: Iterable[DeadLetter]) -> list[str]:
    """Count the held part of each of ``entries`` (see :func:`releasable`) as failed in the
    result backend of its task, as ``mark_as_failure`` would have: the chord's callback
    fails with ``ChordError`` once every other part returned (a polling backend's callback
    fails at once, with the error ``chord_unlock`` gives it). The exception counted is the
    member's stored one when the backend still holds its FAILURE, else
    :class:`DeadLetterDiscarded`. Idempotent: Celery's backend counts a task's part once.
    Returns the ids released; a backend error is logged, that part stays held."""
    released: list[str] = []
    for entry in entries:
        found = chord_of(entry.options or {})
        if found is None:
            continue
        chord, group_id, index = found
        task = app.tasks.get(entry.name)
        backend = task.backend if task is not None else app.backend
        try:
            exc = _stored_exception(backend, entry)
            if polls(backend):  # chord_unlock fails the callback when all are ready: now
                _fail_callback(app, backend, chord, entry.task_id, exc)
            else:
                request = Context(id=entry.task_id, task=entry.name, group=group_id,
                                  group_index=index, chord=chord, delivery_info={})
                backend.on_chord_part_return(request, states.FAILURE, exc)
        except Exception:
            log.exception("could not release the chord part of %s (group %s); it stays held",
                          entry.task_id, group_id)
            continue
        log.info("released the chord part of %s (group %s): its dead letter was discarded",
                 entry.task_id, group_id)
        released.append(entry.task_id)
    return released


def _stored_exception(backend: Any, entry: DeadLetter) -> BaseException:
    """The exception the backend stored for the member, or one describing the discard."""
    meta = backend.get_task_meta(entry.task_id)
    result = meta.get("result") if isinstance(meta, dict) else None
    if meta and meta.get("status") in states.PROPAGATE_STATES and \
            isinstance(result, BaseException):
        return result
    what = f"{entry.exception_type}: {entry.exception_message}" if entry.exception_type \
        else entry.reason
    return DeadLetterDiscarded(f"the dead letter of {entry.task_id} was discarded ({what})")


def polls(backend: Any) -> bool:
    """Whether ``backend`` joins chords with ``celery.chord_unlock`` polling (Celery's
    fallback) rather than counting parts as they return (Redis, and the key-value backends
    that have ``INCR``, which replace ``apply_chord``)."""
    apply_chord = getattr(backend, "apply_chord", None)
    return getattr(apply_chord, "__func__", None) is BaseBackend.apply_chord


def _fail_callback(app: Any, backend: Any, chord: Any, task_id: str,
                   exc: BaseException) -> None:
    """What ``chord_unlock`` does to a chord whose member ``task_id`` failed, unless the
    callback's result is ready already."""
    callback = maybe_signature(chord, app=app)
    if callback is None:
        return
    if callback.id and app.AsyncResult(callback.id, backend=backend).ready():
        return
    try:  # Celery's backend fails the callback from the exception being handled
        raise ChordError(f"Dependency {task_id} raised {exc!r}") from exc
    except ChordError as error:
        backend.chord_error_from_stack(callback, error)


class Unlock(Enum):
    """What a tracked ``celery.chord_unlock`` poll does (:func:`unlock_verdict`)."""

    CELERY = "celery"  # Celery's own poll decides: every member ready, none held
    PENDING = "pending"  # a member is not ready: poll again later, as Celery does
    WAIT = "wait"  # a failed member waits in the dead-letter queue: poll again later
    DONE = "done"  # the callback's result is ready already (a discard failed it): stop


FieldReader = Callable[[Sequence[str], Sequence[str]], list[list[str | None]]]


def unlock_verdict(app: Any, callback: Any, deps: Sequence[Any], fields: FieldReader
                   ) -> Unlock:
    """For a ``chord_unlock`` poll whose header results are ``deps`` (``AsyncResult``): when
    every member is ready and one failed into the dead-letter queue (its record still
    ``failed``/``stalled``/``dropped``, saving dead letters: ``fields`` reads the records),
    the poll waits for its resubmit (:attr:`Unlock.WAIT`), or ends if the callback's result
    is ready already (:attr:`Unlock.DONE`). A member not ready: :attr:`Unlock.PENDING`, poll
    again as Celery does. Otherwise Celery's poll decides. One read of the header's states
    per poll, as Celery's own; the records are read only when a member failed."""
    found: list[tuple[str, str]] = []
    for result in deps:  # up to the first member not ready, as GroupResult.ready() reads
        state = result.state
        if state not in states.READY_STATES:
            return Unlock.PENDING
        found.append((result.id, state))
    failed = [task_id for task_id, state in found if state in states.PROPAGATE_STATES]
    if not failed:
        return Unlock.CELERY
    rows = fields(failed, ("state", "dlq"))
    if not any(state in _DEAD and dlq == "1" for state, dlq in rows):
        return Unlock.CELERY
    signature = maybe_signature(callback, app=app)
    if signature is not None and signature.id and app.AsyncResult(signature.id).ready():
        return Unlock.DONE
    return Unlock.WAIT
