"""Steps sent in one write: a bulk publish's ``submit`` steps (:func:`submit_many`).

Each step is built as a single one is (:mod:`~jobbers_celery.store.steps`, same spec, keys
and script); while :func:`submit_many` builds them, the step's runner adds each call to
the batch (:data:`BATCH`) instead of sending it, and the batch goes out as one write whose
replies are read later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, cast

from jobbers_celery.store.base import SentSteps, StepResult, Submission
from jobbers_celery.store.parts import StepStore
from jobbers_celery.store.sharded import Sharded

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
    (the store's layout unreadable): nothing was sent."""
    calls: list[Call] = []
    token = BATCH.set(calls)
    try:
        for item in items:
            s.submit(item.task_id, sources=item.sources, create=item.create,
                     fields=item.fields, reason=item.reason, name=item.name)
    finally:
        BATCH.reset(token)
    sharded = cast("Sharded", s)
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
        return out

    return SentSteps(results)
