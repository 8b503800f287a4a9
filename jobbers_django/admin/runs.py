"""Paced resubmits: a list (``?fingerprint=FP``: one failure group's runs), and a page per
run with its progress (published, completed, failed again, remaining) refreshing itself
while the run moves, a link to the failure group it was started for, and the pause,
resume, cancel and continue (a halted run) buttons (resubmit permission), each one POST
through :mod:`jobbers_django.dlq.runs`."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from jobbers_django import permissions
from jobbers_django.admin.base import ReadOnlyAdmin
from jobbers_django.admin.display import compact_json, local_time
from jobbers_django.dlq import runs
from jobbers_django.models import (
    FINAL_STATUSES,
    DeadLetterAudit,
    ResubmitRun,
    ResubmitRunItem,
    RunStatus,
    Source,
)

__all__ = ["REFRESH_SECONDS", "GroupFilter", "ResubmitRunAdmin", "group_url"]

#: How often a moving run's page reloads itself.
REFRESH_SECONDS = 2
#: Items listed on a run's page (the counters cover all of them).
ITEMS_SHOWN = 100

_CONTROLS = {"pause": (runs.pause, "paused"), "resume": (runs.resume, "resumed"),
             "cancel": (runs.cancel, "cancelled"), "continue": (runs.continue_run, "continued")}


class GroupFilter(admin.SimpleListFilter):
    """``?fingerprint=FP``: the runs started for one failure group (its row on the groups
    page links here); in the sidebar only while it applies (Django applies a filter only
    when it shows a choice)."""

    title = "failure group"
    parameter_name = "fingerprint"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = request.GET.get(self.parameter_name, "")[:64]
        return [(value, value)] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[ResubmitRun]
                 ) -> QuerySet[ResubmitRun]:
        value = self.value()
        return queryset.filter(filters__fingerprint=value) if value else queryset


def group_url(run: ResubmitRun) -> str | None:
    """The failure group a run was started for (its selection's fingerprint), if any."""
    fingerprint = (run.filters or {}).get("fingerprint") if run.task_ids is None else None
    if not isinstance(fingerprint, str) or not fingerprint:
        return None
    return (reverse("admin:jobbers_failuregroup_changelist") + "?"
            + urlencode({"fingerprint": fingerprint}))


@admin.register(ResubmitRun)
class ResubmitRunAdmin(ReadOnlyAdmin):
    list_display = ("run", "status", "progress", "pace", "rule", "username", "created",
                    "finished")
    list_display_links = None
    list_filter = ("status", GroupFilter)
    sortable_by = ("created",)
    change_form_template = "jobbers/admin/run_detail.html"

    @admin.display(description="run")
    def run(self, obj: ResubmitRun) -> str:
        url = reverse("admin:jobbers_resubmitrun_change", args=[obj.pk])
        return format_html("<a href=\"{}\">#{}</a>", url, obj.pk)

    @admin.display(description="progress")
    def progress(self, obj: ResubmitRun) -> str:
        return (f"{obj.published} of {obj.total} published, {obj.completed} completed, "
                f"{obj.failed_again} failed again")

    @admin.display(description="rate")
    def pace(self, obj: ResubmitRun) -> str:
        return f"{obj.rate:g}/s"

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: ResubmitRun) -> str:
        return local_time(obj.created_at)

    @admin.display(description="finished")
    def finished(self, obj: ResubmitRun) -> str:
        return local_time(obj.finished_at)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Who may view runs, or start them (an operator watches the run they started)."""
        return permissions.can_watch_runs(request.user)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [path("<int:run_id>/control/<str:control>/", wrap(require_POST(self.control)),
                     name="jobbers_run_control"),
                *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        run = ResubmitRun.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        if run is None:
            raise Http404(f"no paced resubmit {object_id}")
        moving = run.status not in FINAL_STATUSES or ResubmitRunItem.objects.filter(
            run=run, published_at__isnull=False, outcome="").exists()
        width = (lambda n: round(100 * n / run.total, 1)) if run.total else (lambda n: 0)
        context = self.admin_context(
            request, f"Paced resubmit #{run.pk}: {run.status}", run=run,
            can_control=permissions.allowed(request.user, permissions.RESUBMIT),
            can_pause=run.status in (RunStatus.QUEUED, RunStatus.RUNNING),
            can_resume=run.status == RunStatus.PAUSED,
            can_cancel=run.status not in FINAL_STATUSES,
            can_continue=run.status == RunStatus.HALTED,
            group_url=group_url(run),
            refresh=REFRESH_SECONDS if moving else None,
            selection=compact_json(run.filters) if run.task_ids is None
            else f"{len(run.task_ids)} task ids",
            bars=[("completed", run.completed, width(run.completed)),
                  ("failed again", run.failed_again, width(run.failed_again)),
                  ("in flight or ended otherwise", run.published - run.completed
                   - run.failed_again, width(run.published - run.completed
                                             - run.failed_again)),
                  ("skipped", run.skipped, width(run.skipped)),
                  ("remaining", run.remaining, width(run.remaining))],
            items=ResubmitRunItem.objects.filter(run=run).exclude(
                published_at__isnull=True, outcome="").order_by("-position")[:ITEMS_SHOWN],
            audit=DeadLetterAudit.objects.filter(run=run).order_by("at", "id"),
            changelist_url=reverse("admin:jobbers_resubmitrun_changelist"),
        )
        return TemplateResponse(request, "jobbers/admin/run_detail.html", context)

    def control(self, request: HttpRequest, run_id: int, control: str) -> HttpResponse:
        if not permissions.allowed(request.user, permissions.RESUBMIT):
            raise PermissionDenied
        if control not in _CONTROLS or not ResubmitRun.objects.filter(pk=run_id).exists():
            raise Http404("no such run or control")
        move, done = _CONTROLS[control]
        try:
            move(run_id, user=request.user, source=Source.ADMIN)
        except runs.RunConflict as exc:
            self.message_user(request, f"Not {done}: {exc}.", messages.WARNING)
        else:
            self.message_user(request, f"Paced resubmit #{run_id} {done}.")
        return HttpResponseRedirect(reverse("admin:jobbers_resubmitrun_change", args=[run_id]))

