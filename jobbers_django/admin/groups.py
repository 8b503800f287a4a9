"""Failure groups (entries grouped by fingerprint, with counts; each links to its entries)
and the audit of every resubmit, discard and cancel, read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.text import Truncator

from jobbers_django import permissions
from jobbers_django.admin import actions, charts
from jobbers_django.admin.base import ReadOnlyAdmin
from jobbers_django.admin.display import breakable, compact_json, local_time
from jobbers_django.admin.filters import ExceptionTypeFilter, TaskNameFilter
from jobbers_django.dlq import runs
from jobbers_django.models import Action, DeadLetterAudit, DeadLetterEntry, FailureGroup, Status
from jobbers_django.redaction import text

__all__ = ["DeadLetterAuditAdmin", "FailureGroupAdmin"]


@admin.register(FailureGroup)
class FailureGroupAdmin(ReadOnlyAdmin):
    # fits a 1366 px window: what failed (type, normalised message, frame) in one column,
    # when in another (last seen, first seen under it)
    list_display = ("task", "failure", "failures", "last_24h", "dead_now", "seen", "buttons")
    list_display_links = None
    list_filter = (TaskNameFilter, ExceptionTypeFilter)
    sortable_by = ("failures", "dead_now", "seen")
    search_fields = ("message",)
    search_help_text = "Searches the normalised messages."
    change_list_template = "jobbers/admin/group_change_list.html"

    # -------------------------------------------------------------- list
    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The page's rows, each with its failures per hour of the last 24 h (one query for
        the whole page, see :func:`charts.hourly_failures`) and whether buttons show."""
        cl = super().get_changelist_instance(request)
        rows = list(cl.result_list)
        hourly = charts.hourly_failures((g.fingerprint for g in rows), timezone.now())
        can_act = permissions.allowed(request.user, permissions.RESUBMIT)
        started = runs.runs_per_group(g.fingerprint for g in rows)
        for group in rows:
            group.jobbers_hourly = hourly.get(group.fingerprint, [0] * charts.HOURS)
            group.jobbers_can_act = can_act
            group.jobbers_runs = started.get(group.fingerprint, 0)
        return cl

    @admin.display(description="last 24 h")
    def last_24h(self, obj: FailureGroup) -> str:
        hourly = getattr(obj, "jobbers_hourly", None)
        if hourly is None:
            return "-"
        return charts.sparkline(hourly, label=f"{sum(hourly)} failures in the last 24 hours, "
                                "one bar per hour, oldest first")

    @admin.display(description="")
    def buttons(self, obj: FailureGroup) -> str:
        if not getattr(obj, "jobbers_can_act", False) or obj.dead <= 0:
            return mark_safe("&nbsp;")  # nothing to act on (the admin would draw "-")
        return format_html(
            '<a class="button jobbers-act" href="{}">Resubmit…</a>'
            '<a class="button jobbers-act" href="{}">Discard…</a>',
            reverse("admin:jobbers_failuregroup_resubmit", args=[obj.pk]),
            reverse("admin:jobbers_failuregroup_discard", args=[obj.pk]))

    # -------------------------------------------------------------- actions
    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/resubmit/", wrap(self.group_action_view),
                 {"action": Action.RESUBMIT}, name="jobbers_failuregroup_resubmit"),
            path("<int:pk>/discard/", wrap(self.group_action_view),
                 {"action": Action.DISCARD}, name="jobbers_failuregroup_discard"),
            *super().get_urls(),
        ]

    def group_action_view(self, request: HttpRequest, pk: int, action: str) -> HttpResponse:
        """Resubmit or discard every dead entry of one group (at most ``MAX_IDS``, newest
        first): a confirmation page (GET), then the action (POST), back on the groups. Needs
        the view and resubmit permissions."""
        if not (self.has_view_permission(request)
                and permissions.allowed(request.user, permissions.RESUBMIT)):
            raise PermissionDenied
        group = get_object_or_404(FailureGroup, pk=pk)
        back = reverse("admin:jobbers_failuregroup_changelist")
        selected = DeadLetterEntry.objects.filter(fingerprint=group.fingerprint)
        if request.method == "POST" and request.POST.get("post") == "yes":
            return self.confirmed(request, selected, action, group) or HttpResponseRedirect(back)
        page = actions.confirmation(
            self, request, selected, action, back_url=back,
            subject=f" of the group {group.task_name}: "
                    f"{Truncator(group.exception_type or text(group.message)).chars(60)}",
            extra_fieldsets=self.confirmation_fieldsets(action, group))
        return page if page is not None else HttpResponseRedirect(back)

    def confirmation_fieldsets(self, action: str, group: FailureGroup) -> list[str]:
        """Templates added inside the group confirmation form of ``action`` (none here):
        with :meth:`confirmed`, where options such as pacing plug in."""
        return []

    def confirmed(self, request: HttpRequest, selected: QuerySet[Any], action: str,
                  group: FailureGroup) -> HttpResponse | None:
        """What confirming does: the action on the entries the page listed, at once, or a
        paced resubmit of them (then its page)."""
        return actions.perform(self, request, selected, action)

    # -------------------------------------------------------------- columns

    @admin.display(description="task", ordering="task_name")
    def task(self, obj: FailureGroup) -> str:
        return breakable(obj.task_name)

    @admin.display(description="failure")
    def failure(self, obj: FailureGroup) -> str:
        """The exception type, the normalised message (links to the group's entries) and
        the innermost application frame."""
        url = reverse("admin:jobbers_deadletterentry_changelist")
        message = text(obj.message)  # credentials taken out by look
        return format_html(
            '{}<a href="{}?{}" title="{}">{}</a>{}', format_html(
                "<strong>{}</strong><br>", breakable(obj.exception_type))
            if obj.exception_type else "",
            url, urlencode({"fingerprint": obj.fingerprint}), message,
            Truncator(message or "(no message)").chars(90),
            format_html('<br><span class="muted">{}</span>', obj.frame) if obj.frame else "")

    @admin.display(description="seen", ordering="last_seen")
    def seen(self, obj: FailureGroup) -> str:
        return format_html('last {}<br><span class="muted">first {}</span>',
                           local_time(obj.last_seen), local_time(obj.first_seen))

    @admin.display(description="dead now", ordering="dead")
    def dead_now(self, obj: FailureGroup) -> str:
        url = reverse("admin:jobbers_deadletterentry_changelist")
        dead = format_html("<a href=\"{}?{}\">{}</a>", url, urlencode(
            {"fingerprint": obj.fingerprint, "status": Status.DEAD}), obj.dead)
        started = getattr(obj, "jobbers_runs", 0)
        if not started:
            return dead
        return format_html(  # the paced resubmits started for this group
            '{}<br><a class="jobbers-group-runs" href="{}?{}">{} paced resubmit{}</a>', dead,
            reverse("admin:jobbers_resubmitrun_changelist"),
            urlencode({"fingerprint": obj.fingerprint}), started,
            "" if started == 1 else "s")


@admin.register(DeadLetterAudit)
class DeadLetterAuditAdmin(ReadOnlyAdmin):
    list_display = ("when", "username", "action", "source", "matched", "acted",
                    "retry_count", "version", "selection")
    list_filter = ("action", "source", ("at", admin.DateFieldListFilter))
    sortable_by = ("when",)

    @admin.display(description="at", ordering="at")
    def when(self, obj: DeadLetterAudit) -> str:
        return local_time(obj.at)

    @admin.display(description="retry count")
    def retry_count(self, obj: DeadLetterAudit) -> str:
        """A choice, not an error: ``reset``, ``kept``, or ``-`` (discard, cancel)."""
        if obj.reset_retry_count is None:
            return "-"
        return "reset" if obj.reset_retry_count else "kept"

    @admin.display(description="selection")
    def selection(self, obj: DeadLetterAudit) -> str:
        if obj.task_ids is not None:
            return Truncator(", ".join(obj.task_ids)).chars(80)
        return Truncator(compact_json(obj.filters)).chars(80)
