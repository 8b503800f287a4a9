"""The workers and queues page, under the entries admin (``deadletterentry/workers/``):
each queue's depth and oldest message, each worker's pool, queues and running tasks with
their heartbeat and progress, the pauses in force; and pausing or resuming a task name or
a queue on every worker behind a confirmation page (a POST with its CSRF token), for who
passes ``JOBBERS_PAUSE_PERMISSION``. Redis or the broker unreachable is a message on the
page, never a 500. Hostnames, task and queue names come from outside: every one is shown
escaped (``printable``) and cut."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from jobbers_celery import PauseError, PauseKind, WorkerView, printable
from jobbers_django import bridge, permissions
from jobbers_django.admin import charts
from jobbers_django.admin.base import STORE_ERRORS, ReadOnlyAdmin
from jobbers_django.admin.display import compact_json, duration, since
from jobbers_django.redaction import redact

__all__ = ["WorkersPagesAdmin"]

#: What the broker's and Celery's failures look like here (on top of the store's).
_ERRORS = (*STORE_ERRORS, OSError, ConnectionError)


def _kind(value: str | None) -> PauseKind | None:
    try:
        return PauseKind(value or "")
    except ValueError:
        return None


class WorkersPagesAdmin(ReadOnlyAdmin):
    """A model admin that also serves the workers and queues page (the entries admin is
    one)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("workers/", wrap(self.workers_view), name="jobbers_workers"),
            path("workers/pause/", wrap(self.pause_view), name="jobbers_pause"),
            *super().get_urls(),
        ]

    def workers_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = self.admin_context(
            request, "Workers and queues",
            can_pause=permissions.allowed(request.user, permissions.PAUSE),
            kinds=[k.value for k in PauseKind])
        try:
            j = bridge.get_jobbers()
            now = j.now()
            views = j.worker_views()
            queues = j.queues(views)
            pauses = [{"pause": p, "held": j.held_count(p.target)
                       if p.kind is PauseKind.TASK else None} for p in j.pauses()]
        except _ERRORS as exc:
            context["error"] = f"Redis or the broker is unreachable: {printable(str(exc))}"
            return TemplateResponse(request, "jobbers/admin/workers.html", context)
        context.update(now=now, queues=queues, pauses=pauses,
                       workers=[self._worker(w, now) for w in views])
        return TemplateResponse(request, "jobbers/admin/workers.html", context)

    @staticmethod
    def _worker(w: WorkerView, now: Any) -> dict[str, Any]:
        return {"view": w, "running": [
            {"task": t, "progress": compact_json(redact(t.progress)),
             "bar": charts.progress_bar(redact(t.progress)),
             "elapsed": duration(since(now, t.started_at)),
             "heartbeat_ago": duration(since(now, t.heartbeat_at))} for t in w.running]}

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the confirmation page of ``?action=pause|resume&kind=task|queue&target=``;
        POST (its form): do it, then back to the page with what it did."""
        if not permissions.allowed(request.user, permissions.PAUSE):
            raise PermissionDenied
        page = reverse("admin:jobbers_workers")
        data = request.POST if request.method == "POST" else request.GET
        action, kind, target = data.get("action"), _kind(data.get("kind")), data.get("target")
        if action not in ("pause", "resume") or kind is None or not target:
            self.message_user(request, "Name a task or a queue to pause or resume.",
                              messages.ERROR)
            return HttpResponseRedirect(page)
        shown = printable(target[:200])
        if request.method != "POST":
            context = self.admin_context(
                request, f"{action.capitalize()} {kind.value} {shown}?", action=action,
                kind=kind.value, target=target, page_url=page,
                held=self._held(target) if kind is PauseKind.TASK and action == "resume"
                else None)
            return TemplateResponse(request, "jobbers/admin/pause_confirmation.html", context)
        by = f"admin:{request.user.get_username()}"[:200]
        arg = {"name" if kind is PauseKind.TASK else "queue": target}
        try:
            j = bridge.get_jobbers()
            done = j.pause(**arg, by=by) if action == "pause" else j.resume(**arg, by=by)
        except PauseError as exc:
            self.message_user(request, f"Not done: {printable(str(exc))}", messages.ERROR)
            return HttpResponseRedirect(page)
        except _ERRORS as exc:
            self.message_user(request, f"Redis or the broker is unreachable: "
                              f"{printable(str(exc))}", messages.ERROR)
            return HttpResponseRedirect(page)
        verb = "paused" if action == "pause" else "resumed"
        text = (f"{kind.value.capitalize()} {shown} {verb}"
                + ("" if done.changed else f" (it was {'already' if verb == 'paused' else 'not'}"
                   " paused)")
                + f"; {len(done.workers)} worker(s) applied it at once")
        if action == "resume" and kind is PauseKind.TASK:
            text += f"; {done.released} held task(s) published again"
        self.message_user(request, text + ".")
        return HttpResponseRedirect(page)

    @staticmethod
    def _held(name: str) -> int | None:
        try:
            return bridge.get_jobbers().held_count(name)
        except _ERRORS:
            return None
