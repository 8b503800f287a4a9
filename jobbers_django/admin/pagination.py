"""The admin's paginator: a capped count and pages read ids first (see
:mod:`jobbers_django.querysets`)."""

from __future__ import annotations

import math
from typing import Any, cast

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

from jobbers_django import querysets

__all__ = ["BoundedPaginator"]


class BoundedPaginator(Paginator):  # type: ignore[type-arg]
    """Counts at most ``cap + 1`` rows (``COUNT(*)`` over a ``LIMIT``ed subquery), so a page
    of a million-row table never counts the table; pages stop at ``cap`` rows (narrow the
    filters to reach older entries). Templates say "more than {cap}" when ``capped``."""

    cap = 10_000

    @cached_property
    def count(self) -> int:
        return querysets.count_at_most(cast("QuerySet[Any]", self.object_list), self.cap + 1)

    @property
    def capped(self) -> bool:
        return self.count > self.cap

    @cached_property
    def num_pages(self) -> int:
        if self.capped:
            return math.ceil(self.cap / self.per_page)
        return int(super().num_pages)

    def page(self, number: Any) -> Any:
        """The page's ids first, then their rows (:func:`~jobbers_django.querysets.ids_first`)."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        rows = querysets.ids_first(cast("QuerySet[Any]", self.object_list), bottom, top)
        return self._get_page(rows, number, self)  # type: ignore[attr-defined]
