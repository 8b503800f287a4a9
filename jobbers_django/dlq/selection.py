"""Which dead letters an action takes: a :class:`Selection` (explicit ids, or filters and a
limit; never neither), and the dead entries it stands for now (:func:`candidates`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from jobbers_celery import UNPUBLISHABLE
from jobbers_django import bridge, conf
from jobbers_django.models import DeadLetterEntry, Status
from jobbers_django.querysets import FILTERS, NEWEST_FIRST, filter_entries

__all__ = ["FILTERS", "Selection", "SelectionError", "candidates", "current_versions",
           "filter_entries"]


class SelectionError(ValueError):
    """A selection that must not run; ``field`` names the culprit."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class Selection:
    """Which dead letters an action is for: explicit ``task_ids`` or ``filters``, never
    neither (an empty selection does not mean "everything"). ``limit`` bounds what a filter
    takes; explicit ids are all taken (at most ``MAX_IDS``)."""

    task_ids: tuple[str, ...] | None = None
    filters: Mapping[str, Any] = field(default_factory=dict)
    limit: int = conf.DEFAULT_RESUBMIT_LIMIT

    def __post_init__(self) -> None:
        if self.task_ids is not None and self.filters:
            raise SelectionError("task_ids", "give task_ids or filters, not both")
        if self.task_ids is None and not self.filters:
            raise SelectionError("filters", "give task_ids or at least one filter; "
                                 "an empty selection never means everything")
        if self.task_ids is not None:
            if not self.task_ids:
                raise SelectionError("task_ids", "must not be empty")
            if len(self.task_ids) > conf.MAX_IDS:
                raise SelectionError("task_ids", f"at most {conf.MAX_IDS} ids per request, "
                                     f"got {len(self.task_ids)}")
        unknown = set(self.filters) - set(FILTERS)
        if unknown:
            raise SelectionError(min(unknown), "unknown filter")
        if not 1 <= self.limit <= conf.MAX_LIMIT:
            raise SelectionError("limit", f"must be between 1 and {conf.MAX_LIMIT}")

    @property
    def cap(self) -> int:
        """How many entries the action may take: every id given, or ``limit`` of a filter."""
        return len(self.task_ids) if self.task_ids is not None else self.limit

    def describe(self) -> dict[str, Any]:
        """JSON-ready, for the audit."""
        return {k: v.isoformat() if isinstance(v, datetime) else v
                for k, v in self.filters.items()}


def publishable(qs: QuerySet[DeadLetterEntry]) -> QuerySet[DeadLetterEntry]:
    """``qs`` without the entries that cannot be published again (their arguments were
    never recorded as JSON, see ``DeadLetter.unpublishable``), nor by this process (sealed
    with a payload key it does not hold)."""
    return bridge.openable(qs.exclude(options__has_key=UNPUBLISHABLE))


def candidates(selection: Selection, publishable_only: bool = False
               ) -> QuerySet[DeadLetterEntry]:
    """The dead entries ``selection`` takes, newest first; ``publishable_only``: only those
    that can be published again (a resubmit leaves the others)."""
    qs = DeadLetterEntry.objects.filter(status=Status.DEAD)
    if publishable_only:
        qs = publishable(qs)
    if selection.task_ids is not None:
        return qs.filter(task_id__in=selection.task_ids).order_by(*NEWEST_FIRST)
    filters = dict(selection.filters)
    filters.pop("status", None)  # actions only ever take dead entries
    return filter_entries(qs, filters).order_by(*NEWEST_FIRST)


def current_versions(selection: Selection) -> dict[str, int]:
    """The current version of every task the selection would resubmit (see
    ``Jobbers.current_versions``); ``SelectionError`` on ``version`` if one is not
    registered in this process's Celery app, before anything changes."""
    names = set(candidates(selection, publishable_only=True)[: selection.cap]
                .values_list("task_name", flat=True))
    try:
        return bridge.get_jobbers().current_versions(names)
    except ValueError as exc:
        raise SelectionError("version", str(exc)) from None
