"""The workflow page, under the live pages (``deadletterentry/live/workflow/<id>/``): a
canvas (chain, group, chord) as one unit, found from any member's id, with its state, a bar
of k of n completed, failed and running, its elapsed time, the members that block it
(highlighted), its members (each linking to its task page) and its own history; and the
actions Cancel workflow and Resubmit failed members behind a confirmation page.

Presentation only: the workflow is read through :mod:`jobbers_django.bridge`, cancelled
there too, and resubmitted by :func:`jobbers_django.dlq.actions.resubmit_workflow` (the
same code as the REST API). Redis unreachable is a message on the page, never a 500."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from jobbers_celery import (
    DlqUsageError,
    TaskRecord,
    TaskState,
    WorkflowState,
    check_task_id,
    printable,
)
from jobbers_django import bridge, permissions
from jobbers_django.admin import charts
from jobbers_django.admin.base import STORE_ERRORS, ReadOnlyAdmin
from jobbers_django.admin.display import compact_json, duration
from jobbers_django.converters import ADMIN_TASK_ID
from jobbers_django.dlq.actions import resubmit_workflow
from jobbers_django.models import Source
from jobbers_django.redaction import shown

__all__ = ["ACTIONS", "SEGMENTS", "UNKNOWN_TASK", "WorkflowPagesAdmin", "elapsed",
           "in_workflow", "malformed", "short", "workflow_bar"]

#: The bar's parts, in the order drawn, with their colours (the live page's, per state).
SEGMENTS: tuple[tuple[str, str], ...] = (
    ("completed", charts.STATE_COLOURS[TaskState.COMPLETED]),
    ("failed", charts.STATE_COLOURS[TaskState.FAILED]),
    ("running", charts.STATE_COLOURS[TaskState.STARTED]),
    ("pending", charts.STATE_COLOURS[TaskState.SUBMITTED]),
    ("cancelled", charts.STATE_COLOURS[TaskState.CANCELLED]),
)
#: The page's actions: (title, who may, what it says, button).
ACTIONS: dict[str, tuple[str, str, str]] = {
    "cancel": ("Cancel workflow", permissions.CANCEL,
               ("Every member not finished yet is cancelled: a submitted or scheduled one at "
               "once (it never runs), a running one at its next heartbeat.")),
    "resubmit": ("Resubmit failed members", permissions.RESUBMIT,
                 ("Every failed, stalled or dropped member goes back to the broker with its "
                 "id; a chord whose header member failed runs its callback once they "
                 "complete. Their dead-letter entries become resubmitted.")),
}
#: The members each action acts on, by state (listed on its confirmation page).
TARGETS: dict[str, frozenset[TaskState]] = {
    "cancel": frozenset({TaskState.SUBMITTED, TaskState.SCHEDULED, TaskState.STARTED}),
    "resubmit": frozenset({TaskState.FAILED, TaskState.STALLED, TaskState.DROPPED}),
}
#: The workflow page reloads its content this often while the workflow runs.
REFRESH_SECONDS = 5


def elapsed(delta: timedelta | None) -> str:
    """``340 ms`` under a second and ``3.4s`` under ten (a canvas's members often take
    less than one), else as the other pages say it (``12s``, ``3m 05s``, ``1h 02m``)."""
    if delta is None:
        return ""
    seconds = max(delta.total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f}s" if seconds < 10 else duration(delta)


def in_workflow(record: TaskRecord) -> str | None:
    """The id that opens the workflow page of a canvas member (its own: any member's id
    finds its workflow), ``None`` for a task published alone (jobbers records a root,
    parent or group only for canvas members)."""
    if record.root_id or record.parent_id or record.group_id:
        return record.task_id
    return None


def workflow_bar(counts: dict[str, int], total: int) -> SafeString:
    """One bar of ``total`` members, a segment per state (completed first), each with its
    count as a tooltip, and a legend."""
    parts = [(name, colour, counts.get(name, 0)) for name, colour in SEGMENTS]
    bar = format_html_join(
        "", '<span class="jobbers-wf-{}" style="width:{}%;background:{}" title="{}: {}">'
        "</span>",
        ((name, f"{100 * n / total:.2f}", colour, name, n)
         for name, colour, n in parts if n and total))
    legend = format_html_join(
        "", '<li data-state="{}"><span class="swatch" style="background:{}"></span>{} {}</li>',
        ((name, colour, n, name) for name, colour, n in parts))
    return format_html(
        '<div class="jobbers-wf-bar" role="img" aria-label="{} of {} completed">{}</div>'
        '<ul class="jobbers-legend" id="jobbers-wf-legend">{}</ul>',
        counts.get("completed", 0), total, bar, legend)


#: What the page of an id jobbers knows nothing of says (a 404).
UNKNOWN_TASK = ("jobbers has no record of this task and no dead-letter entry: the id may be "
                "mistyped, or the task ended longer ago than jobbers_retention (its record "
                "was then removed).")
#: How much of an id a title shows (the whole id is on the page).
TITLE_CHARS = 80


def malformed(task_id: str) -> str | None:
    """Why no task can have ``task_id`` (longer than the bound, or not UTF-8: the REST
    API's 400 and the command lines' exit 2 for the same rule), or ``None``."""
    try:
        check_task_id(task_id)
    except DlqUsageError as exc:
        return f"Not a task id: {exc.message}."
    return None


def short(task_id: str) -> str:
    return task_id if len(task_id) <= TITLE_CHARS else task_id[:TITLE_CHARS - 3] + "..."


class WorkflowPagesAdmin(ReadOnlyAdmin):
    """The workflow page and its two actions (the entries admin serves them, with the
    live pages)."""

    def no_task_page(self, request: HttpRequest, task_id: str, status: int,
                     why: str) -> HttpResponse:
        """A task or workflow page for an id with nothing to show: ``status`` (400: no
        task can have it; 404: none has it) and why, never a 200 that reads as a page."""
        title = ("Not a task id" if status == 400
                 else f"No task {printable(short(task_id))}")
        context = self.admin_context(request, title, task_id=short(task_id), why=why,
                                     status=status)
        return TemplateResponse(request, "jobbers/admin/no_task.html", context, status=status)

    def workflow_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            # the admin's readable form of any id (jobbers_django.converters): never a "/"
            path(f"live/workflow/<{ADMIN_TASK_ID}:task_id>/", wrap(self.workflow_view),
                 name="jobbers_workflow"),
            path(f"live/workflow/<{ADMIN_TASK_ID}:task_id>/cancel/",
                 wrap(self.workflow_cancel_view), name="jobbers_workflow_cancel"),
            path(f"live/workflow/<{ADMIN_TASK_ID}:task_id>/resubmit/",
                 wrap(self.workflow_resubmit_view), name="jobbers_workflow_resubmit"),
        ]

    def _workflow_read(self, task_id: str) -> dict[str, Any]:
        """The page's values: the workflow and its parts as shown, or why there is none."""
        try:
            detail = bridge.workflow_detail(task_id)
        except STORE_ERRORS as exc:
            return {"error": f"Redis is unreachable: {exc}"}
        if detail is None:
            return {"missing": True}
        flow, now = detail.workflow, detail.now
        blocking = set(flow.blocking)
        counts = {"completed": flow.completed, "failed": flow.failed,
                  "running": flow.running, "pending": flow.pending,
                  "cancelled": flow.cancelled}
        members = []
        for m in flow.members:
            r = shown(m.record)
            members.append({"m": m, "record": r, "blocking": r.task_id in blocking,
                            "elapsed": elapsed(detail.elapsed(r)),
                            # an earlier attempt's error is no longer what a completed
                            # member says
                            "error": r.error if r.state is not TaskState.COMPLETED else None,
                            "bar": charts.progress_bar(r.progress),
                            "progress": compact_json(r.progress)})
        names = {m.record.task_id: m.record for m in flow.members}
        return {
            "flow": flow, "now": now, "counts": counts,
            "bar": workflow_bar(counts, flow.total),
            "elapsed": elapsed(flow.elapsed),
            "members": members,
            "blockers": [{"task_id": b, "record": names.get(b)} for b in flow.blocking],
            "history": [shown(t) for t in flow.history],
            "running": flow.state is WorkflowState.RUNNING,
            # a workflow is named after its root task, or its group when it is a group
            "root_is_task": flow.root_id in names,
        }

    def workflow_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = malformed(task_id)
        if refused:
            return self.no_task_page(request, task_id, 400, refused)
        read = self._workflow_read(task_id)
        if read.get("missing"):
            return self.no_task_page(request, task_id, 404, "No workflow has this id: "
                                     "no such task, or its record expired (records are "
                                     "kept for jobbers_retention).")
        flow = read.get("flow")
        title = (f"Workflow {printable(flow.root_id)}" if flow is not None
                 else f"Workflow of {printable(task_id)}")
        context = self.admin_context(
            request, title, task_id=task_id, wf=read, refresh_seconds=REFRESH_SECONDS,
            can_cancel=permissions.allowed(request.user, permissions.CANCEL),
            can_resubmit=permissions.allowed(request.user, permissions.RESUBMIT))
        return TemplateResponse(request, "jobbers/admin/workflow.html", context)

    def workflow_cancel_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        return self._workflow_act(request, task_id, "cancel")

    def workflow_resubmit_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        return self._workflow_act(request, task_id, "resubmit")

    def _workflow_act(self, request: HttpRequest, task_id: str, action: str) -> HttpResponse:
        title, rule, explained = ACTIONS[action]
        if not permissions.allowed(request.user, rule):
            raise PermissionDenied
        page = reverse("admin:jobbers_workflow", args=[task_id])
        if request.method == "POST":
            try:
                if action == "cancel":
                    terminate = request.POST.get("terminate") == "1"
                    done = bridge.cancel_workflow(task_id, terminate=terminate,
                                                  user=request.user, source=Source.ADMIN)
                    said = (f"cancelled, or asked to stop (a running one stops at its next "
                            f"heartbeat{', or is terminated' if terminate else ''})")
                else:
                    reset = request.POST.get("reset_retry_count") != "0"
                    done = resubmit_workflow(task_id, reset_retry_count=reset,
                                             user=request.user, source=Source.ADMIN)
                    said = f"resubmitted (retry count {'reset' if reset else 'kept'})"
            except STORE_ERRORS as exc:
                self.message_user(request, f"Redis is unreachable: {exc}", messages.ERROR)
                return HttpResponseRedirect(page)
            if done:
                self.message_user(request, f"Workflow of {printable(task_id)}: {len(done)} "
                                  f"member{'s' if len(done) != 1 else ''} {said}.",
                                  messages.SUCCESS)
            else:
                nothing = ("cancel: every member has finished" if action == "cancel"
                           else "resubmit: no member failed")
                self.message_user(request, f"Workflow of {printable(task_id)}: nothing to "
                                  f"{nothing} (or it is unknown).", messages.WARNING)
            return HttpResponseRedirect(page)
        # the workflow's members only to who may view them; acting does not need them
        read: dict[str, Any] = (self._workflow_read(task_id)
                                if self.has_view_permission(request) else {"hidden": True})
        targets = [row for row in read.get("members", ())
                   if row["record"].state in TARGETS[action]]
        context = self.admin_context(
            request, f"{title}?", task_id=task_id, wf=read, action=action, targets=targets,
            action_title=title, explained=explained, workflow_url=page)
        return TemplateResponse(request, "jobbers/admin/workflow_confirmation.html", context)
