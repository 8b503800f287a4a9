"""How the dead-letter tables are listed, in one place for the admin, the API and the
services: filters by name, a count that stops at a cap, a page read ids first, and keyset
paging with its cursor. The admin and the views only present what these return.

Made for tables of millions of entries: nothing here counts a whole table, and a page
costs the same at any depth.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from django.db.models import Count, Model, Q, QuerySet, Sum

__all__ = [
    "FILTERS",
    "NEWEST_FIRST",
    "CursorError",
    "count_at_most",
    "dead_totals",
    "decode_cursor",
    "encode_cursor",
    "failure_groups",
    "filter_entries",
    "ids_first",
    "keyset",
]

_M = TypeVar("_M", bound=Model)

#: Filter name -> ORM lookup on ``DeadLetterEntry``. Values arrive validated (see the API
#: serializers).
FILTERS: dict[str, str] = {
    "queue": "queue",
    "task_name": "task_name",
    "task_version": "task_version",
    "exception_type": "exception_type",
    "fingerprint": "fingerprint",
    "reason": "reason",
    "status": "status",
    "failed_after": "last_failed_at__gte",
    "failed_before": "last_failed_at__lt",
}

#: The order the entry indexes are built for: last failure, newest first.
NEWEST_FIRST = ("-last_failed_at", "-id")

_MALFORMED = "malformed cursor; use a `next` link as given"


def filter_entries(qs: QuerySet[_M], filters: Mapping[str, Any]) -> QuerySet[_M]:
    """``qs`` narrowed by ``filters`` (names of :data:`FILTERS`; all must match)."""
    return qs.filter(**{FILTERS[name]: value for name, value in filters.items()})


def count_at_most(qs: QuerySet[Any], limit: int) -> int:
    """The rows of ``qs``, counted up to ``limit`` (``COUNT(*)`` over a ``LIMIT``ed
    subquery): ask for one more than a cap to tell "more than the cap"."""
    return qs.order_by()[:limit].count()


def ids_first(ordered: QuerySet[_M], start: int, stop: int,
              rows: QuerySet[_M] | None = None) -> list[_M]:
    """``ordered[start:stop]``, read as the ids first, then their rows (from ``rows``,
    default ``ordered``): an ids-only query is an index-only scan of (filter,
    -last_failed_at, -id), where the planner, asked for whole rows, may walk the
    newest-first index and filter, which is slow when the filter's entries are all old
    (150 ms instead of 0.4 ms at a million entries)."""
    ids = list(ordered.values_list("pk", flat=True)[start:stop])
    by_pk = (ordered if rows is None else rows).in_bulk(ids)
    return [by_pk[pk] for pk in ids if pk in by_pk]


def keyset(qs: QuerySet[_M], field: str, descending: bool,
           after: tuple[Any, int] | None = None) -> QuerySet[_M]:
    """``qs`` ordered by ``(field, pk)``, starting after the row whose key is ``after``
    (a keyset page: the same cost at any depth, unlike an offset)."""
    if after is not None:
        value, pk = after
        op = "lt" if descending else "gt"
        qs = qs.filter(Q(**{f"{field}__{op}": value}) | Q(**{field: value, f"pk__{op}": pk}))
    sign = "-" if descending else ""
    return qs.order_by(f"{sign}{field}", f"{sign}pk")


def failure_groups(qs: QuerySet[_M], filters: Mapping[str, Any], ordering: str) -> QuerySet[_M]:
    """Failure groups (``qs``: the table) narrowed by ``task_name``, ``exception_type`` and
    ``dead`` (true: with dead entries now), in ``ordering`` (``-last_seen`` or
    ``-failures``, each an index of the table; ties newest row first)."""
    wanted = {k: filters[k] for k in ("task_name", "exception_type") if k in filters}
    if "dead" in filters:
        wanted["dead__gt" if filters["dead"] else "dead__lte"] = 0
    return qs.filter(**wanted).order_by(ordering, "-id")


def dead_totals(groups: QuerySet[_M]) -> tuple[int, int]:
    """Dead entries in all, and the failure groups holding some (``groups``: the failure
    groups' table; one aggregate over a small table, never a count of the entries)."""
    totals = groups.aggregate(dead_sum=Sum("dead"), with_dead=Count("pk", filter=Q(dead__gt=0)))
    return int(totals["dead_sum"] or 0), int(totals["with_dead"] or 0)


class CursorError(ValueError):
    """A cursor that cannot be used; the message says why, for the client."""


def encode_cursor(row: Model, ordering: str, field: str) -> str:
    """The cursor of the page after ``row`` in ``ordering`` (whose key is ``field``)."""
    value = getattr(row, field)
    raw = {"o": ordering, "v": value.isoformat() if isinstance(value, datetime) else value,
           "i": row.pk}
    return base64.urlsafe_b64encode(json.dumps(raw, separators=(",", ":")).encode()
                                    ).decode().rstrip("=")


def decode_cursor(token: str, ordering: str, field: str) -> tuple[Any, int]:
    """The key ``(value, pk)`` a cursor of :func:`encode_cursor` holds for ``ordering``;
    :class:`CursorError` if it is malformed or was made for another ordering."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(raw, dict) or set(raw) != {"o", "v", "i"}:
            raise ValueError(token)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise CursorError(_MALFORMED) from None
    if raw["o"] != ordering:
        raise CursorError(f"was made for ordering={raw['o']}, not {ordering}")
    try:
        pk = raw["i"]
        if not isinstance(pk, int) or isinstance(pk, bool):
            raise TypeError(token)
        value = raw["v"]
        if field.endswith("_at"):
            value = datetime.fromisoformat(value)
            if value.tzinfo is None:
                raise ValueError(token)
        elif field == "failure_count":
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(token)
        elif not isinstance(value, str):
            raise TypeError(token)
    except (ValueError, TypeError):
        raise CursorError(_MALFORMED) from None
    return value, pk
