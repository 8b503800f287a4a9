"""Dead-letter entries: a read-only changelist with filters and search, a detail page with
the failure history and the task's lifecycle transitions, and the actions resubmit
(resetting the retry count or keeping it) and discard, each behind a confirmation page.

An id-looking search term is an exact (indexed) ``task_id`` match; any other term searches
the messages, which scans (bounded by the page size and the count cap).
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import Truncator

from jobbers_django import bridge, conf, permissions
from jobbers_django.admin import actions
from jobbers_django.admin.aside import SetAsideAdminMixin
from jobbers_django.admin.display import breakable, json_block, local_time
from jobbers_django.admin.filters import (
    ExceptionTypeFilter,
    FingerprintFilter,
    QueueFilter,
    ReasonFilter,
    StatusFilter,
    TaskNameFilter,
    VersionFilter,
)
from jobbers_django.admin.history import HistoryAdminMixin
from jobbers_django.admin.lifecycle import lifecycle
from jobbers_django.admin.live import LivePagesAdmin
from jobbers_django.admin.periodic import PeriodicPagesAdmin
from jobbers_django.admin.ratelimits import RateLimitsPagesAdmin
from jobbers_django.admin.search import SearchPagesAdmin
from jobbers_django.admin.workers import WorkersPagesAdmin
from jobbers_django.admin.workflows import in_workflow
from jobbers_django.models import (
    Action,
    DeadLetterEntry,
    DeadLetterFailure,
    FailureGroup,
    Status,
)
from jobbers_django.redaction import shown_arguments, text

__all__ = ["DeadLetterEntryAdmin"]
#: Task ids that look like Celery's (uuid4) are searched as ids, never as messages.
_UUID = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                   r"[0-9a-fA-F]{12}")


@admin.register(DeadLetterEntry)
class DeadLetterEntryAdmin(SetAsideAdminMixin, SearchPagesAdmin, HistoryAdminMixin, PeriodicPagesAdmin,
                           WorkersPagesAdmin, RateLimitsPagesAdmin,
                           LivePagesAdmin):
    # fits a 1366 px window beside the filters: the id is cut (the full one in its
    # tooltip and on the entry's page), the version goes with the name, long text wraps
    list_display = ("short_id", "task", "queue", "reason", "exception", "n_failures",
                    "last_failed", "status")
    list_filter = (TaskNameFilter, VersionFilter, QueueFilter, ReasonFilter, ExceptionTypeFilter,
                   StatusFilter, ("last_failed_at", admin.DateFieldListFilter), FingerprintFilter)
    sortable_by = ("last_failed",)
    search_fields = ("task_id",)  # shows the box; get_search_results decides
    search_help_text = ("A task id finds that task (exact match); any other text searches "
                        "the exception messages (slower on large tables).")
    actions = ("resubmit_selected", "discard_selected")
    change_list_template = "jobbers/admin/entry_change_list.html"
    change_form_template = "jobbers/admin/entry_detail.html"
    fieldsets = (
        (None, {"fields": ("task_id", "task_name", "task_version", "queue", "status",
                           "group")}),
        ("Last failure", {"fields": ("reason", "exception_type", "exception_message_display",
                                     "traceback_display", "worker", "attempt",
                                     "retry_attempt", "failure_count", "first_failed_at",
                                     "last_failed_at")}),
        ("Arguments (secrets redacted, long values cut)", {
            "fields": ("args_display", "kwargs_display", "checkpoint_display",
                       "options_display")}),
        ("Resubmission", {"fields": ("resubmit_count", "resubmitted_at", "discarded_at",
                                     "publish_pending_display")}),
    )
    readonly_fields = ("group", "publish_pending_display", "exception_message_display", "traceback_display",
                       "args_display", "kwargs_display",
                       "checkpoint_display", "options_display")

    # -------------------------------------------------------------- list
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and match.url_name == "jobbers_deadletterentry_changelist":
            # the list shows none of these: a page of big payloads is not read for nothing
            qs = qs.defer("args", "kwargs", "options", "checkpoint", "traceback")
        return qs

    @admin.display(description="task id")
    def short_id(self, obj: DeadLetterEntry) -> str:
        return format_html('<span title="{}">{}</span>', obj.task_id,
                           Truncator(obj.task_id).chars(13))

    @admin.display(description="task")
    def task(self, obj: DeadLetterEntry) -> str:
        if obj.task_version is None:
            return breakable(obj.task_name)
        return format_html('{} <span class="muted">v{}</span>', breakable(obj.task_name),
                           obj.task_version)

    @admin.display(description="failures")
    def n_failures(self, obj: DeadLetterEntry) -> int:
        return obj.failure_count

    @admin.display(description="last failed", ordering="last_failed_at")
    def last_failed(self, obj: DeadLetterEntry) -> str:
        return local_time(obj.last_failed_at)

    @admin.display(description="exception")
    def exception(self, obj: DeadLetterEntry) -> str:
        # the list does not read the arguments: credentials are taken out by look only
        message = text(obj.exception_message)
        full = f"{obj.exception_type}: {message}" if obj.exception_type else message
        return format_html("<span title=\"{}\">{}</span>", full,
                           Truncator(f"{obj.exception_type.rpartition('.')[2]}: {message}"
                                     if obj.exception_type else message).chars(70))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if _UUID.fullmatch(term) or (not any(c.isspace() for c in term)
                                     and DeadLetterEntry.objects.filter(task_id=term).exists()):
            return queryset.filter(task_id=term), False
        return queryset.filter(exception_message__icontains=term), False

    # -------------------------------------------------------------- detail
    @admin.display(description="failure group")
    def group(self, obj: DeadLetterEntry) -> str:
        group = FailureGroup.objects.filter(fingerprint=obj.fingerprint).first()
        url = reverse("admin:jobbers_deadletterentry_changelist")
        label = (f"{group.failures} failures, {group.dead} dead now: "
                 f"{Truncator(text(group.message)).chars(80)}" if group else obj.fingerprint)
        return format_html("<a href=\"{}?{}\">{}</a>", url,
                           urlencode({"fingerprint": obj.fingerprint}), label)

    @admin.display(description="publish pending")
    def publish_pending_display(self, obj: DeadLetterEntry) -> str:
        """A state, not an error: ``yes`` (marked resubmitted, not yet published) or ``no``."""
        return "yes" if obj.publish_pending else "no"

    @admin.display(description="traceback")
    def traceback_display(self, obj: DeadLetterEntry) -> str:
        if not obj.traceback:
            return "-"
        return format_html("<details><summary>show</summary><pre>{}</pre></details>",
                           text(obj.traceback, obj.task_name, obj.args, obj.kwargs))

    @admin.display(description="exception message")
    def exception_message_display(self, obj: DeadLetterEntry) -> str:
        return text(obj.exception_message, obj.task_name, obj.args, obj.kwargs)

    @admin.display(description="args")
    def args_display(self, obj: DeadLetterEntry) -> str:
        shown = shown_arguments(obj.task_name, obj.args, obj.kwargs)
        return json_block(shown[0], cut=shown[2])

    @admin.display(description="kwargs")
    def kwargs_display(self, obj: DeadLetterEntry) -> str:
        shown = shown_arguments(obj.task_name, obj.args, obj.kwargs)
        return json_block(shown[1], cut=shown[3])

    @admin.display(description="checkpoint")
    def checkpoint_display(self, obj: DeadLetterEntry) -> str:
        return json_block(obj.checkpoint)

    @admin.display(description="publish options")
    def options_display(self, obj: DeadLetterEntry) -> str:
        return json_block(obj.options)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: DeadLetterEntry | None = None) -> HttpResponse:
        if obj is not None:
            shown_lifecycle = lifecycle(obj.task_id)
            record = shown_lifecycle.get("record")
            context.update(
                failures=_redacted(obj, bridge.failure_history(obj.task_id)),
                lifecycle=shown_lifecycle,
                # a canvas member's entry links its workflow (a chord it holds is repaired
                # there)
                workflow_id=in_workflow(record) if record is not None else None,
                can_resubmit=obj.status == Status.DEAD and self.has_resubmit_permission(request),
                changelist_url=reverse("admin:jobbers_deadletterentry_changelist"),
                action_checkbox_name=ACTION_CHECKBOX_NAME,
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    # -------------------------------------------------------------- actions
    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<int:object_id>/resubmit/", wrap(self.entry_action_view),
                 {"action": Action.RESUBMIT}, name="jobbers_deadletterentry_resubmit"),
            path("<int:object_id>/discard/", wrap(self.entry_action_view),
                 {"action": Action.DISCARD}, name="jobbers_deadletterentry_discard"),
            *super().get_urls(),
        ]

    def has_resubmit_permission(self, request: HttpRequest) -> bool:
        return permissions.allowed(request.user, permissions.RESUBMIT)

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        guarded = {"resubmit_selected", "discard_selected"}
        if (request.method == "POST" and guarded & set(request.POST.getlist("action"))
                and not self.has_resubmit_permission(request)):
            raise PermissionDenied
        return super().changelist_view(request, {"live_url": reverse("admin:jobbers_live"),
                                                 "max_action_ids": conf.MAX_IDS,
                                                 **(extra_context or {})})

    @admin.action(description="Resubmit selected dead-letter entries…",
                  permissions=["resubmit"])
    def resubmit_selected(self, request: HttpRequest, queryset: QuerySet[Any]
                          ) -> HttpResponse | None:
        return self._act(request, queryset, Action.RESUBMIT)

    @admin.action(description="Discard selected dead-letter entries…",
                  permissions=["resubmit"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[Any]
                         ) -> HttpResponse | None:
        return self._act(request, queryset, Action.DISCARD)

    def _act(self, request: HttpRequest, queryset: QuerySet[Any], action: str
             ) -> HttpResponse | None:
        """The bulk actions' confirmation page (it posts back to the changelist with the
        selection), and what confirming it does."""
        if request.POST.get("post") == "yes":
            return self.confirmed(request, queryset, action)
        return actions.confirmation(
            self, request, queryset, action, back_url=request.get_full_path(),
            hidden=[("action", f"{actions.verb_of(action)}_selected"),
                    ("select_across", request.POST.get("select_across", "0")),
                    *((ACTION_CHECKBOX_NAME, pk)
                      for pk in request.POST.getlist(ACTION_CHECKBOX_NAME))],
            extra_fieldsets=self.confirmation_fieldsets(action))

    def entry_action_view(self, request: HttpRequest, object_id: int, action: str
                          ) -> HttpResponse:
        """Resubmit or discard one entry from its page: a confirmation page (GET), then the
        action (POST), back on the entry's page. Needs the view and resubmit permissions."""
        if not (self.has_view_permission(request) and self.has_resubmit_permission(request)):
            raise PermissionDenied
        entry = get_object_or_404(DeadLetterEntry, pk=object_id)
        entry_url = reverse("admin:jobbers_deadletterentry_change", args=[entry.pk])
        selected = DeadLetterEntry.objects.filter(pk=entry.pk)
        if request.method == "POST" and request.POST.get("post") == "yes":
            return self.confirmed(request, selected, action) or HttpResponseRedirect(entry_url)
        page = actions.confirmation(self, request, selected, action, back_url=entry_url,
                                    extra_fieldsets=self.confirmation_fieldsets(action))
        return page if page is not None else HttpResponseRedirect(entry_url)

    def confirmation_fieldsets(self, action: str) -> list[str]:
        """Templates added inside the confirmation form of ``action`` (none here): with
        :meth:`confirmed`, where options such as pacing plug in."""
        return []

    def confirmed(self, request: HttpRequest, selected: QuerySet[Any], action: str
                  ) -> HttpResponse | None:
        """What confirming does: the action on the entries the page listed, at once, or a
        paced resubmit of them (then its page)."""
        return actions.perform(self, request, selected, action)


def _redacted(entry: DeadLetterEntry, failures: Any) -> list[DeadLetterFailure]:
    """The entry's failures for the page, their messages and tracebacks redacted (copies in
    memory, never saved)."""
    shown = list(failures)
    for failure in shown:
        failure.exception_message = text(failure.exception_message, entry.task_name,
                                         entry.args, entry.kwargs)
        failure.traceback = text(failure.traceback, entry.task_name, entry.args, entry.kwargs)
    return shown
