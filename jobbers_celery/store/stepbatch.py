"""Steps sent in one write: a bulk publish's ``submit`` steps (:func:`submit_many`).

Each step is built as a single one is (:mod:`~jobbers_celery.store.steps`, same spec, keys
and script); while :func:`submit_many` builds them, the step's runner adds each call to
the batch (:data:`BATCH`) instead of sending it, and the batch goes out as one write whose
replies are read later.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextvars import ContextVar
from typing import Any, cast

from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.store import fairshare
from jobbers_celery.store.base import SentSteps, StepResult, Submission
from jobbers_celery.store.parts import StepStore
from jobbers_celery.store.sharded import Sharded

log = escaped_logger("jobbers.store")

#: A batched call: its keys, its arguments, what turns its reply into the result.
Call = tuple[list[str], list[str], Callable[[Sequence[Any]], StepResult]]

#: Set by :func:`submit_many` while it builds its steps: the step's runner adds each call
#: here instead of sending it.
BATCH: ContextVar[list[Call] | None] = ContextVar("jobbers_step_batch", default=None)
#: What the runner returns for a step it added to a batch (never seen outside the store).
BATCHED = StepResult(applied=False, previous="batched", now_ms=0, attempt=0, why="batched")


def given(result: StepResult) -> StepResult:
    """A step's result known without a call (a duplicate refused in the global slot): in a
    batch being built, added as it is (no call to send)."""
    batch = BATCH.get()
    if batch is None:
        return result
    batch.append(([], [], lambda _raw: result))
    return BATCHED


def submit_many(s: StepStore, items: Sequence[Submission]) -> SentSteps:
    """The ``submit`` steps of ``items`` (a bulk publish's members), each built by
    :meth:`submit` as a single publish builds it (same spec, keys and script: whatever a
    publish's step records, a batched one records), sent in one write without waiting for
    the replies; :meth:`SentSteps.results` reads them. Raises if a step cannot be built
    (the store's layout unreadable): nothing was sent.

    A member under fair shares (``fair``) is parked by its step when its key has no room,
    as a single publish is: on one shard each step decides in its own script (the steps
    run in order, each sees the places the ones before it took); on several, the members'
    ``admit`` calls go first in the global slot, in one round trip for the batch
    (:func:`~jobbers_celery.store.fairshare.admit_many`), and a member counted there whose
    step then did not apply is withdrawn once the replies are read; if ``admit_many``
    raises (the ones before the error may have run), every fair member is."""
    sharded = cast("Sharded", s)
    split = bool(sharded.sharded) and any(item.fair is not None and item.name
                                          for item in items)
    admitted: dict[int, tuple[bool, bool]] = {}
    if split:
        fair_at = [i for i, item in enumerate(items) if item.fair is not None and item.name]
        fair = [(items[i].name, items[i].task_id, cast("FairKey", items[i].fair))
                for i in fair_at]
        try:
            got = fairshare.admit_many(sharded, fair)
        except Exception:
            # the admits before the error may have run (a lost reply): every member is
            # withdrawn, a ZREM of one never admitted doing nothing
            _withdraw(sharded, fair)
            raise
        admitted = dict(zip(fair_at, got, strict=True))
    calls: list[Call] = []
    token = BATCH.set(calls)
    try:
        for i, item in enumerate(items):
            if i in admitted:  # sharded: decided in the global slot above
                later = None if admitted[i][0] else (fairshare.PARK_BACKSTOP_MS,
                                                     cast("FairKey", item.fair).parked_reason)
                s.submit(item.task_id, sources=item.sources, create=item.create,
                         fields=item.fields, reason=item.reason, name=item.name, later=later)
            else:
                s.submit(item.task_id, sources=item.sources, create=item.create,
                         fields=item.fields, reason=item.reason, name=item.name,
                         fair=item.fair)
    except Exception as exc:
        # nothing is sent: the places admit counted are given back
        _withdraw_unapplied(sharded, items, admitted, [exc] * len(items))
        raise
    finally:
        BATCH.reset(token)
    read = sharded._transition.send_many([(keys, args) for keys, args, _ in calls if keys])

    def results() -> list[StepResult | Exception]:
        out: list[StepResult | Exception] = []
        replies = iter(read())
        for keys, _, finish in calls:
            reply = next(replies) if keys else []  # a duplicate refused before (sharded)
            if isinstance(reply, Exception):
                out.append(reply)
                continue
            try:
                out.append(finish(reply))
            except Exception as exc:  # noqa: BLE001 - a reply it cannot read: a failed step
                out.append(exc)
        _withdraw_unapplied(sharded, items, admitted, out)
        return out

    def unsent(ids: Collection[str]) -> None:
        fairshare.withdraw_many(sharded, [
            (item.name, item.task_id, item.fair) for item in items
            if item.fair is not None and item.name and item.task_id in ids])

    return SentSteps(results, unsent)


def _withdraw_unapplied(s: Sharded, items: Sequence[Submission],
                        admitted: dict[int, tuple[bool, bool]],
                        results: list[StepResult | Exception]) -> None:
    """Sharded: the members ``admit`` counted whose step did not apply (refused, or
    failed) stop holding a place of their key, as a single publish's
    (:func:`~jobbers_celery.store.steps.submit`), and so do those it ended ``cancelled``
    (a member published into a cancelled workflow). Never raises: a place not given back
    expires (``ON_THE_WAY_MS``)."""
    def kept(result: StepResult | Exception) -> bool:
        return isinstance(result, StepResult) and result.applied \
            and result.state is not TaskState.CANCELLED

    _withdraw(s, [(items[i].name, items[i].task_id, cast("FairKey", items[i].fair))
                  for i, (_, counted) in admitted.items() if counted and not kept(results[i])])


def _withdraw(s: Sharded, gone: Sequence[tuple[str, str, FairKey]]) -> None:
    """:func:`~jobbers_celery.store.fairshare.withdraw_many`, logged instead of raised."""
    if not gone:
        return
    try:
        fairshare.withdraw_many(s, gone)
    except Exception:
        log.warning("could not withdraw %d fair-share place(s) of a bulk publish's unapplied "
                    "steps: they expire on their own", len(gone), exc_info=True)
