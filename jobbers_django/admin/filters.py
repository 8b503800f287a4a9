"""The entries' and groups' list filters. Their parameters are the API's filter names
(``?task_name=...``); choices come from the failure groups (a small table) or the model's
choices, or the filter is a text box: no filter reads the entries to offer choices."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.text import Truncator

from jobbers_django.models import FailureGroup

__all__ = [
    "MAX_CHOICES",
    "ChoicesFilter",
    "ExactFilter",
    "ExceptionTypeFilter",
    "FingerprintFilter",
    "GroupValuesFilter",
    "InputFilter",
    "QueueFilter",
    "ReasonFilter",
    "StatusFilter",
    "TaskNameFilter",
    "VersionFilter",
]

#: Choices a filter offers at most (the failure groups table is small, but not bounded).
MAX_CHOICES = 200


class ExactFilter(admin.SimpleListFilter):
    """``?<parameter_name>=<value>``: an exact match on the column of that name (the
    parameters are the API's filter names)."""

    parameter_name: str

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = (self.value() or "").strip()
        if not value:
            return queryset
        try:
            return queryset.filter(**{self.parameter_name: value})
        except (ValueError, ValidationError) as exc:  # e.g. a version that is not a number
            raise IncorrectLookupParameters(exc) from exc


class GroupValuesFilter(ExactFilter):
    """Choices read from the failure groups (``SELECT DISTINCT`` over a small table),
    never from the entries; a value passed in the URL filters even if not offered."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = list(FailureGroup.objects.exclude(**{self.parameter_name: ""})
                      .order_by(self.parameter_name)
                      .values_list(self.parameter_name, flat=True).distinct()[:MAX_CHOICES])
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(v, v) for v in values]


class TaskNameFilter(GroupValuesFilter):
    title = "task name"
    parameter_name = "task_name"


class ExceptionTypeFilter(GroupValuesFilter):
    title = "exception type"
    parameter_name = "exception_type"


class ChoicesFilter(ExactFilter):
    """A choices field (``?status=dead``); the choices come from the model."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(model_admin.model._meta.get_field(self.parameter_name).flatchoices)


class ReasonFilter(ChoicesFilter):
    title = "reason"
    parameter_name = "reason"


class StatusFilter(ChoicesFilter):
    title = "status"
    parameter_name = "status"


class InputFilter(ExactFilter):
    """A text box, for columns whose values no small table lists (no query for choices)."""

    template = "jobbers/admin/input_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: Any) -> Any:
        yield {
            "name": self.parameter_name,
            "value": self.value() or "",
            "hidden": [(k, v) for k, values in changelist.filter_params.items()
                       if k != self.parameter_name for v in values],
            "clear": changelist.get_query_string(remove=[self.parameter_name]),
        }


class QueueFilter(InputFilter):
    title = "queue"
    parameter_name = "queue"


class VersionFilter(InputFilter):
    title = "task version"
    parameter_name = "task_version"


class FingerprintFilter(ExactFilter):
    """``?fingerprint=<fp>`` (the groups page links here); shown only while it is set."""

    title = "failure group"
    parameter_name = "fingerprint"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        fp = self.value()
        if not fp:
            return []
        group = FailureGroup.objects.filter(fingerprint=fp).first()
        return [(fp, f"{group.exception_type or group.task_name}: "
                     f"{Truncator(group.message).chars(60)}" if group else fp)]
