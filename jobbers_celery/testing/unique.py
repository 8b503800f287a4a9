"""Unique tasks' locks in the in-memory store, as ``_lib.lua``'s ``uq_*`` keep them: taken
by the step that makes a record (or resubmits one), free once the holder's record is gone,
past the lock's point (see :data:`jobbers_celery.store.unique.HOLDING`) or older than its
expiry."""

from __future__ import annotations

from collections.abc import Mapping

from jobbers_celery.core.states import TERMINAL, TaskState
from jobbers_celery.core.unique import UniqueInfo, parse_field
from jobbers_celery.store.unique import HOLDING

__all__ = ["MemoryLocks"]


class MemoryLocks:
    """digest -> (holder id, expiry ms)."""

    def __init__(self) -> None:
        self.locks: dict[str, tuple[str, int]] = {}

    def holder(self, records: Mapping[str, Mapping[str, str]], digest: str, now: int
               ) -> str | None:
        """The live holder of ``digest``'s lock, if any."""
        held = self.locks.get(digest)
        if held is None or held[1] <= now:
            return None
        rec = records.get(held[0])
        field = parse_field((rec or {}).get("uq"))
        if rec is None or field is None or rec.get("state") not in HOLDING[field.until]:
            return None
        return held[0]

    def take(self, records: Mapping[str, Mapping[str, str]], task_id: str,
             rec: Mapping[str, str] | None, cur: TaskState, to: TaskState,
             create: Mapping[str, str] | None, now: int) -> str | None:
        """Before a step: take the lock a publish (``create``) or a resubmit carries;
        returns the live holder instead when another copy holds it."""
        if rec is None:
            uq = (create or {}).get("uq")
        elif cur in TERMINAL and to is TaskState.SUBMITTED:
            uq = rec.get("uq")
        else:
            return None
        field = parse_field(uq)
        if field is None:
            return None
        holder = self.holder(records, field.digest, now)
        if holder is not None and holder != task_id:
            return holder
        self.locks[field.digest] = (task_id, now + field.hold_ms)
        return None

    def release(self, task_id: str, rec: Mapping[str, str] | None) -> None:
        """After a step: free the lock once its holder no longer holds it."""
        field = parse_field((rec or {}).get("uq"))
        if field is None or (self.locks.get(field.digest) or ("",))[0] != task_id:
            return
        if (rec or {}).get("state") not in HOLDING[field.until]:
            del self.locks[field.digest]

    def info(self, records: Mapping[str, Mapping[str, str]], task_id: str, now: int
             ) -> UniqueInfo | None:
        """As :func:`jobbers_celery.store.unique.unique_of`."""
        field = parse_field((records.get(task_id) or {}).get("uq"))
        if field is None:
            return None
        return UniqueInfo(field.digest, field.until, field.hold_ms,
                          self.holder(records, field.digest, now))
