"""What every jobbers admin page shares: read-only model admins with cheap lists, and the
errors of reading Redis that a page shows as a message."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.http import HttpRequest

from jobbers_celery import ConfigurationError, StoreUnavailable, human_time
from jobbers_django import conf, permissions
from jobbers_django.admin.pagination import BoundedPaginator

__all__ = ["STORE_ERRORS", "ReadOnlyAdmin"]

#: What reading Redis can raise (Redis cannot serve the call, or jobbers is not installed
#: on the Celery app): the admin shows these as a message, never as a 500.
STORE_ERRORS = (StoreUnavailable, ConfigurationError)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Nothing here is added, edited or deleted by hand; lists stay cheap on big tables."""

    paginator = BoundedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = conf.DEFAULT_PAGE_SIZE

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """The read rule for this model (:func:`jobbers_django.permissions.can_read`): every
        page showing its records, the custom ones included, asks this."""
        return permissions.can_read(request.user, self.model)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """Every time field of a record's page shown in the one time format (``2026-11-27
        21:33:05 UTC``, as the lists, the CLI and the logs), not in Django's
        ``DATETIME_FORMAT``: each ``DateTimeField`` is replaced by a read-only callable
        (every field here is read-only: no change permission)."""
        return [(name, {**options, "fields": [_shown_time(self.model, f)
                                              for f in options["fields"]]})
                for name, options in super().get_fieldsets(request, obj)]

    def admin_context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {**self.admin_site.each_context(request), "opts": self.model._meta,
                "title": title, **extra}


def _shown_time(model: type[models.Model], name: Any) -> Any:
    """``name`` itself unless it names a ``DateTimeField``; then a callable showing it in
    the one format, labelled as the field is."""
    try:
        field = model._meta.get_field(name) if isinstance(name, str) else None
    except FieldDoesNotExist:
        field = None
    if not isinstance(field, models.DateTimeField):
        return name

    def shown(obj: Any) -> str:
        return human_time(getattr(obj, name)).replace(" UTC", "\u00a0UTC")

    shown.short_description = field.verbose_name  # type: ignore[attr-defined]
    shown.__name__ = f"{name}_shown"
    return shown
