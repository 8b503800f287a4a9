"""Unique tasks' locks, read (see core/unique.py; they are taken and released by the steps,
``_lib.lua``'s ``uq_*``, and ``uniq.lua`` in the sharded layout)."""

from __future__ import annotations

from jobbers_celery.core.unique import UniqueInfo, Until, parse_field
from jobbers_celery.store.sharded import Sharded

__all__ = ["HOLDING", "unique_holder", "unique_of"]

#: The states in which a copy holds its lock, by ``until`` (its record past them: free).
HOLDING: dict[Until, frozenset[str]] = {
    Until.START: frozenset({"submitted", "scheduled", "unsubmitted"}),
    Until.END: frozenset({"submitted", "scheduled", "unsubmitted", "started"}),
    Until.WINDOW: frozenset({"submitted", "scheduled", "unsubmitted", "started", "completed",
                             "failed", "stalled", "dropped"}),
}


def unique_holder(s: Sharded, digest: str) -> str | None:
    """The id of the copy holding the lock of key ``digest`` (64 hex digits), ``None``
    when none holds it (no lock, or one naming a copy whose record is gone or past the
    lock's point, which the next publish takes over). Two reads, no write."""
    holder = s.client.get(s.keys.unique(digest))
    if not holder:
        return None
    state, uq = s.client.hmget(s.keys_of(str(holder)).task(str(holder)), "state", "uq")
    field = parse_field(uq)
    if state is None or field is None or field.digest != digest:
        return None
    return str(holder) if state in HOLDING[field.until] else None


def unique_of(s: Sharded, task_id: str) -> UniqueInfo | None:
    """The lock of task ``task_id`` if it is a unique task (its record's field ``uq``),
    with its holder now; ``None`` for another task or no record."""
    field = parse_field(s.client.hget(s.keys_of(task_id).task(task_id), "uq"))
    if field is None:
        return None
    return UniqueInfo(field.digest, field.until, field.hold_ms,
                      unique_holder(s, field.digest))
