"""Set-aside dead letters: a bounded Redis list operators read, so one entry no sink takes
never holds up the ones behind it, and is never silently dropped.

The dispatcher sets an entry aside when the sink refuses it for a reason of its own (also in
its storable form), and an unreadable parked entry (the outbox's or the spool's). Each item
is one JSON object: when, why (the sink's error, scrubbed of the entry's values), where it
came from, the entry's id, name, attempt and reason (escaped and cut, for people) and the
entry's JSON as it was parked (for a person to repair and write by hand). The list keeps the
newest :data:`KEEP` items; a counter counts every item ever set aside, and an item the bound
drops is logged. Read by ``Jobbers.set_aside()``: the admin, the API and both command lines.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import DeadLetter, SetAside, SetAsideReport
from jobbers_celery.core.storable import ID_LIMIT, storable_form
from jobbers_celery.store.parts import DeadLetterStore

if TYPE_CHECKING:
    from jobbers_celery.store.keys import Keys

__all__ = ["KEEP", "AsideStore", "SetAsideList"]

log = escaped_logger("jobbers.deadletter")

#: Items the list keeps (the newest); older ones are dropped, logged and still counted.
KEEP = 1_000
_MAX_WHY = 1_000


class AsideStore(DeadLetterStore, Protocol):
    """The dead-letter part of a store, and the keys it names in the logs (the Redis store,
    or the in-memory one of :mod:`jobbers_celery.testing`)."""

    @property
    def keys(self) -> Keys: ...


class SetAsideList:
    """The set-aside list of one dataset (its global keys)."""

    def __init__(self, store: AsideStore) -> None:
        self.store = store

    def add(self, raw: str | None, why: str, source: str,
            entry: DeadLetter | None = None) -> None:
        """Keep ``raw`` (the entry's JSON as parked) with ``why``; raises the Redis error
        when Redis refuses (the caller keeps the entry waiting)."""
        shown = storable_form(entry) if entry is not None else None
        item = json.dumps({
            "at": datetime.now(UTC).isoformat(), "why": why[:_MAX_WHY], "source": source,
            "task_id": shown.task_id if shown else None,
            "name": shown.name if shown else None,
            "attempt": shown.attempt if shown else None,
            "reason": shown.reason[:ID_LIMIT] if shown else None,
            "entry": raw,
        })
        if self.store.set_aside_push(item, KEEP) > KEEP:
            log.error("the set-aside list %s holds %d items: its oldest one was dropped (it is "
                      "still counted in %s)", self.store.keys.dead_letter_set_aside, KEEP,
                      self.store.keys.dead_letter_set_aside_count)

    def report(self, limit: int = 100) -> SetAsideReport:
        """The newest ``limit`` items, how many are kept and how many were ever set aside."""
        items, kept, total = self.store.set_aside_read(limit)
        return SetAsideReport(kept=kept, total=max(total, kept),
                              entries=[parse(text) for text in items])


def parse(text: str) -> SetAside:
    """One list item; an item that is not what :meth:`SetAsideList.add` writes (edited by
    hand) is shown as unreadable rather than failing the whole list."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError(type(data).__name__)
        return SetAside(at=datetime.fromisoformat(str(data["at"])), why=str(data["why"]),
                        source=str(data["source"]), task_id=_text(data.get("task_id")),
                        name=_text(data.get("name")), attempt=_int(data.get("attempt")),
                        reason=_text(data.get("reason")), entry=_text(data.get("entry")))
    except Exception:  # noqa: BLE001 - any odd item is shown as such
        return SetAside(at=datetime.fromtimestamp(0, UTC), why="unreadable set-aside item",
                        source="?", task_id=None, name=None, attempt=None, reason=None,
                        entry=text)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
