"""The live pages, under the entries admin (``deadletterentry/live/``): counts per state,
running, stalled and scheduled tasks from Redis, the cleaner's last pass, one task's record
and transitions (:mod:`~jobbers_django.admin.lifecycle`), and the cancel action behind a
confirmation page. Redis unreachable is a message on the page, never a 500."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from jobbers_celery import TaskState, printable
from jobbers_django import bridge, permissions
from jobbers_django.admin import charts
from jobbers_django.admin.base import STORE_ERRORS
from jobbers_django.admin.display import compact_json, duration, since
from jobbers_django.admin.lifecycle import lifecycle
from jobbers_django.admin.workflows import (
    UNKNOWN_TASK,
    WorkflowPagesAdmin,
    in_workflow,
    malformed,
)
from jobbers_django.converters import ADMIN_TASK_ID
from jobbers_django.models import DeadLetterEntry, Source
from jobbers_django.redaction import shown

__all__ = ["HISTORY_MINUTES", "REFRESH_SECONDS", "LivePagesAdmin"]

#: The live page's chart of tasks per state covers this many minutes.
HISTORY_MINUTES = 60
#: The live page reloads its content this often (``jobbers/live.js``).
REFRESH_SECONDS = 5


class LivePagesAdmin(WorkflowPagesAdmin):
    """A model admin that also serves the live pages and the workflow pages (the entries
    admin is one)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("live/", wrap(self.live_view), name="jobbers_live"),
            # any id Celery runs, in a readable, reversible form (jobbers_django.converters)
            path(f"live/task/<{ADMIN_TASK_ID}:task_id>/", wrap(self.task_view),
                 name="jobbers_task"),
            path(f"live/cancel/<{ADMIN_TASK_ID}:task_id>/", wrap(self.cancel_view),
                 name="jobbers_cancel"),
            *self.workflow_urls(),
            *super().get_urls(),
        ]

    def live_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = self.admin_context(request, "Live tasks",
                                     can_cancel=permissions.allowed(request.user,
                                                                    permissions.CANCEL))
        try:
            overview = bridge.live_overview()
            # what the rate limits hold back now, per task name (docs/howto/rate-limits.md)
            rate_held = [i for i in bridge.get_jobbers().rate_limits() if i.held]
        except STORE_ERRORS as exc:
            context["error"] = f"Redis is unreachable: {exc}"
            return TemplateResponse(request, "jobbers/admin/live.html", context)
        now = overview.now
        entries = dict(DeadLetterEntry.objects.filter(
            task_id__in=[r.task_id for r in overview.stalled]).values_list("task_id", "pk"))
        context.update(
            counts=[(state.value, overview.counts.get(state.value, 0)) for state in TaskState],
            chart=charts.state_charts(overview.history, now, minutes=HISTORY_MINUTES),
            history_minutes=HISTORY_MINUTES, refresh_seconds=REFRESH_SECONDS,
            running=[{"record": r, "progress": compact_json(r.progress),
                      "bar": charts.progress_bar(r.progress),
                      "elapsed": duration(since(now, r.retried_at or r.started_at)),
                      "heartbeat_ago": duration(since(now, r.heartbeat_at))}
                     for r in map(shown, overview.running)],
            stalled=[{"record": shown(r), "entry_pk": entries.get(r.task_id)} for r in overview.stalled],
            # a task held by a paused task name has no run_at: it waits for the resume
            scheduled=[{"record": shown(r), "due_in": "paused: held until resumed"
                        if r.run_at is None else duration(since(r.run_at, now))
                        if r.run_at > now else "due"} for r in overview.scheduled],
            cleaner=overview.cleaner, now=now, rate_held=rate_held, fair=overview.fair,
        )
        return TemplateResponse(request, "jobbers/admin/live.html", context)

    def task_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        """The task's page; a 400 for an id no task can have (too long, not UTF-8) and a
        404 for one jobbers knows nothing of, each saying so, as the REST API answers."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = malformed(task_id)
        if refused:
            return self.no_task_page(request, task_id, 400, refused)
        entry = DeadLetterEntry.objects.filter(task_id=task_id).first()
        shown_lifecycle = lifecycle(task_id)
        record = shown_lifecycle.get("record")
        if (entry is None and record is None and not shown_lifecycle.get("transitions")
                and not shown_lifecycle.get("error")):
            return self.no_task_page(request, task_id, 404, UNKNOWN_TASK)
        context = self.admin_context(
            request, f"Task {printable(task_id)}", task_id=task_id, lifecycle=shown_lifecycle,
            entry=entry, can_cancel=permissions.allowed(request.user, permissions.CANCEL),
            workflow_id=in_workflow(record) if record is not None else None)
        return TemplateResponse(request, "jobbers/admin/task.html", context)

    def cancel_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        if not permissions.allowed(request.user, permissions.CANCEL):
            raise PermissionDenied
        live_url = reverse("admin:jobbers_live")
        if request.method == "POST":
            terminate = request.POST.get("terminate") == "1"
            try:
                done = bridge.cancel_task(task_id, terminate=terminate, user=request.user,
                                            source=Source.ADMIN)
            except STORE_ERRORS as exc:
                self.message_user(request, f"Redis is unreachable: {exc}", messages.ERROR)
                return HttpResponseRedirect(live_url)
            if done:
                self.message_user(request, f"Task {printable(task_id)}: cancelled, or "
                                  "cancellation requested (a running task stops at its next "
                                  "heartbeat"
                                  + (", or is terminated" if terminate else "") + ").")
            else:
                self.message_user(request, f"Task {printable(task_id)} was not cancelled: "
                                  "it is unknown or already finished.", messages.WARNING)
            return HttpResponseRedirect(live_url)
        # the task's record only to who may view it; cancelling does not need it
        shown_record = (lifecycle(task_id) if self.has_view_permission(request)
                        else {"hidden": True})
        context = self.admin_context(request, f"Cancel task {printable(task_id)}?",
                                     task_id=task_id, lifecycle=shown_record,
                                     live_url=live_url)
        return TemplateResponse(request, "jobbers/admin/cancel_confirmation.html", context)

