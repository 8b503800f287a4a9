"""The find page, under the entries admin (``deadletterentry/find/``): a task by its id
(the box every jobbers page carries, ``jobbers/admin/_find.html``, sends here and is sent on
to the task's page) or by an argument's value (:meth:`jobbers_celery.Jobbers.search`: an
indexed path, or the bounded search of the newest records, the page saying which and how
much it read). Bad input is a message on the page (400), Redis unreachable too (never a
500). Results show records only: no argument in clear."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from jobbers_celery import SearchError
from jobbers_django import bridge
from jobbers_django.admin.base import STORE_ERRORS, ReadOnlyAdmin
from jobbers_django.redaction import shown

__all__ = ["ID_MAX_LENGTH", "SearchPagesAdmin"]

#: Characters of an id the box takes (the API's bound).
ID_MAX_LENGTH = 1024
#: Tasks the page lists at most.
PAGE_LIMIT = 200
_LABELS = {"argument": "Argument", "value": "Value", "name": "Task name", "limit": "Limit"}


class SearchPagesAdmin(ReadOnlyAdmin):
    """Adds the find page to a model admin (the entries admin)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [path("find/", wrap(self.find_view), name="jobbers_find"), *super().get_urls()]

    def find_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        task_id = request.GET.get("id")
        if task_id is not None:
            task_id = task_id.strip()
            if task_id and len(task_id) <= ID_MAX_LENGTH:
                return HttpResponseRedirect(reverse("admin:jobbers_task", args=[task_id]))
            return self._page(request, status=400, id_error=(
                f"A task id is 1 to {ID_MAX_LENGTH:,} characters."))
        argument = request.GET.get("arg", "").strip()
        value = request.GET.get("value", "")
        name = request.GET.get("name", "").strip() or None
        if not argument and not value:
            return self._page(request)
        try:
            found = bridge.get_jobbers().search(argument, value, name=name, limit=PAGE_LIMIT)
        except SearchError as exc:
            return self._page(request, status=400, arg=argument, value=value, name=name,
                              error=f"{_LABELS.get(exc.field, exc.field)}: {exc.message}")
        except STORE_ERRORS as exc:
            return self._page(request, arg=argument, value=value, name=name,
                              error=f"Redis is unreachable: {exc}")
        return self._page(request, arg=argument, value=value, name=name, searched=True,
                          tasks=[shown(r) for r in found.tasks], how=found.how,
                          more=found.more, limit=PAGE_LIMIT)

    def _page(self, request: HttpRequest, status: int = 200, **extra: object) -> HttpResponse:
        context = self.admin_context(request, "Find tasks", **extra)
        return TemplateResponse(request, "jobbers/admin/find.html", context, status=status)
