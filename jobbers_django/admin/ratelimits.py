"""The rate limits page, under the entries admin (``deadletterentry/rate-limits/``): each
task name's rate limit keyed by arguments (``rate_limit_by``; ``docs/howto/rate-limits.md``),
declared, overridden and in force, with how many of its tasks wait on it; and setting or
clearing an override (a POST with its CSRF token) for who passes
``JOBBERS_RATE_LIMIT_PERMISSION``. A bad rate, or a name that is not a task with
``rate_limit_by`` here, is a 400 with the reason on the page; Redis
unreachable is a message, never a 500. Task names come from outside: shown escaped."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from jobbers_celery import printable
from jobbers_django import bridge, permissions
from jobbers_django.admin.base import STORE_ERRORS, ReadOnlyAdmin

__all__ = ["RateLimitsPagesAdmin"]


class RateLimitsPagesAdmin(ReadOnlyAdmin):
    """A model admin that also serves the rate limits page (the entries admin is one)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [path("rate-limits/", wrap(self.rate_limits_view), name="jobbers_rate_limits"),
                *super().get_urls()]

    def rate_limits_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the limits; POST ``name``, ``rate`` (``10/s`` or ``off``) or ``clear``:
        set or clear that name's override, then back to the page with what it did."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        can_set = permissions.allowed(request.user, permissions.RATE_LIMIT)
        error = None
        if request.method == "POST":
            if not can_set:
                raise PermissionDenied
            name = request.POST.get("name", "")
            rate = None if "clear" in request.POST else request.POST.get("rate", "")
            try:
                jobbers = bridge.get_jobbers()
                jobbers.check_rate_limit_override(name, rate)
                now = jobbers.set_rate_limit(name, rate)
            except ValueError as exc:
                error = f"Not done: {printable(str(exc))}"
            except STORE_ERRORS as exc:
                error = f"Redis is unreachable: {printable(str(exc))}"
            else:
                shown = printable(name[:200])
                self.message_user(request, f"{shown}: override cleared, its declared rate "
                                  "applies." if now is None else
                                  f"{shown}: {now} from its next start, on every worker.")
                return HttpResponseRedirect(reverse("admin:jobbers_rate_limits"))
        context = self.admin_context(request, "Rate limits", can_set=can_set, error=error)
        try:
            context["limits"] = bridge.get_jobbers().rate_limits()
        except STORE_ERRORS as exc:
            context["error"] = f"Redis is unreachable: {printable(str(exc))}"
        if error:
            messages.error(request, error)
        return TemplateResponse(request, "jobbers/admin/rate_limits.html", context,
                                status=400 if error and request.method == "POST" else 200)
