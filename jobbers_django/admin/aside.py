"""The set-aside page (``deadletterentry/set-aside/``): dead letters the sink refused for a
reason of their own, also in their storable form, or that could not be read back, kept in a
bounded Redis list while the entries behind them were written (see
:mod:`jobbers_django.setaside`). Needs the read permission of the entries; Redis unreachable
is a message on the page, never a 500."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from jobbers_django import conf
from jobbers_django.admin.base import STORE_ERRORS, ReadOnlyAdmin
from jobbers_django.setaside import listing, shown_item

__all__ = ["SetAsideAdminMixin"]


class SetAsideAdminMixin(ReadOnlyAdmin):
    """Adds the set-aside page to a model admin (the entries admin)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [path("set-aside/", wrap(self.set_aside_view), name="jobbers_set_aside"),
                *super().get_urls()]

    def set_aside_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = self.admin_context(request, "Set-aside dead letters")
        try:
            report = listing(conf.MAX_LIMIT)
        except STORE_ERRORS as exc:
            context["error"] = f"Redis is unreachable: {exc}"
        else:
            context.update(kept=report.kept, total=report.total,
                           items=[shown_item(i) for i in report.entries])
        return TemplateResponse(request, "jobbers/admin/set_aside.html", context)
